"""Packaging only (the project's metadata is in pyproject.toml): the Alembic tree lives at the top level,
`migrations/`, and ships inside the wheel as `app/migrations`, so an installed coordinator still migrates
its own database. pyproject.toml alone cannot add a mapped package to the ones `find` discovers."""

from setuptools import find_namespace_packages, setup

setup(
    # Namespace discovery: the data folders (dashboard assets, Swagger UI's) are packages too, which
    # keeps setuptools from warning that it would leave them out.
    packages=[
        *find_namespace_packages(include=["app*", "engine_agent*"], exclude=["*__pycache__*"]),
        "app.migrations",
        "app.migrations.versions",
    ],
    package_dir={"app.migrations": "migrations"},
)
