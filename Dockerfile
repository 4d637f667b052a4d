# One image for the coordinator (`epctl serve`) and the agents (`epctl-agent`), CPU build of torch.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /srv/epctl

# The CPU torch first, so the project's unpinned torch does not pull a CUDA build of several GB.
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"

COPY pyproject.toml setup.py alembic.ini ./
COPY app ./app
COPY engine_agent ./engine_agent
COPY migrations ./migrations
# A regular install: the migrations ship inside the package (migrations/, mapped to app/migrations), so the installed
# coordinator migrates its database to head at start.
RUN pip install .

ENV EPCTL_DATA_DIR=/data
VOLUME ["/data"]
EXPOSE 8000
CMD ["epctl", "serve", "--host", "0.0.0.0", "--port", "8000"]
