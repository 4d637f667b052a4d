# One image for the coordinator (`epctl serve`) and the agents (`epctl-agent`), CPU build of torch.
# Exactly the locked set (requirements/runtime.txt: the pins CI tested, without the dev extras).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /srv/epctl

COPY requirements/pip.txt requirements/torch.txt requirements/runtime.txt ./requirements/
RUN pip install -r requirements/pip.txt
# The CPU torch, without its dependencies (the lock has them at their pins).
RUN pip install --no-deps --index-url https://download.pytorch.org/whl/cpu -r requirements/torch.txt
RUN pip install --no-deps -r requirements/runtime.txt

COPY pyproject.toml setup.py alembic.ini ./
COPY app ./app
COPY engine_agent ./engine_agent
COPY migrations ./migrations
# A regular install: the migrations ship inside the package (migrations/, mapped to app/migrations), so the installed
# coordinator migrates its database to head at start. `pip check`: the lock covers what the project asks for.
RUN pip install --no-deps --no-build-isolation . && pip check

ENV EPCTL_DATA_DIR=/data
VOLUME ["/data"]
EXPOSE 8000
CMD ["epctl", "serve", "--host", "0.0.0.0", "--port", "8000"]
