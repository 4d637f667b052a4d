"""The coordinator as a Kubernetes API server for one group, `epctl.io/v1`, so that kubectl pointed at it
(`kubectl --server https://coordinator --token ...`) and client-go's scale client work unchanged:

- discovery, open as the API server's is to any client: `/api` (no core group), `/apis` (our group),
  `/apis/epctl.io`, `/apis/epctl.io/v1` (`deployments`, `deployments/scale`), `/version`;
- `deployments` in the namespace `kube_namespace` (`EPCTL_KUBE_NAMESPACE`, default `default`): list
  (also across namespaces) and get, as objects or as the `Table` `kubectl get` asks for;
- `deployments/{name}/scale`: GET, PUT and PATCH with `/v1/deployments/{name}/scale`'s rules and bodies
  (`app.scale.service`, `app.scale.patches`), also at `apps/v1`'s path for clients that hard-code it.

A body without `Content-Type` is JSON, as the API server reads it; errors on these paths are
Kubernetes `Status` objects (`app.scale.kube.status`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Header, Request, Response
from sqlmodel import Session

from app.api.deps import DatabaseDep, Reader, Scaler, SettingsDep
from app.api.params import DeploymentRefPath
from app.core.clock import utc_now
from app.core.errors import InvalidRequestError, NotFoundError
from app.deployments.service import get_deployment, list_deployments
from app.jobs.requests import IdempotencyKeyHeader
from app.scale import patches, service
from app.scale.kube import objects
from app.scale.models import Scale
from app.scale.writes import write_scale

# Kubernetes reads a PUT body without Content-Type as JSON: so does every route here.
router = APIRouter(tags=["kubernetes"], strict_content_type=False)
GROUP_PATH = f"/apis/{objects.GROUP_VERSION}"
SCALE_PATHS = (
    f"{GROUP_PATH}/namespaces/{{namespace}}/deployments/{{name}}/scale",
    f"/apis/{objects.APPS_GROUP_VERSION}/namespaces/{{namespace}}/deployments/{{name}}/scale",
)


class WrongNamespace(NotFoundError):
    code = "namespace-not-found"


class NamespaceMismatch(InvalidRequestError):
    code = "namespace-mismatch"


def _check_namespace(namespace: str, settings: Any, name: str | None = None) -> None:
    if namespace != settings.kube_namespace:
        what = f"deployments.{objects.GROUP} {name!r}" if name else "deployments"
        raise WrongNamespace(
            f"{what} not found in namespace {namespace!r}: this coordinator's deployments are in "
            f"{settings.kube_namespace!r} (EPCTL_KUBE_NAMESPACE)"
        )


def _in_namespace(scale: Scale, namespace: str) -> Scale:
    scale.metadata.namespace = namespace
    return scale


# --- discovery -----------------------------------------------------------------------------------------


@router.get("/api", name="core-versions", include_in_schema=False)
async def core_versions() -> dict[str, Any]:
    return objects.api_versions()


@router.get("/apis", name="groups", include_in_schema=False)
async def groups() -> dict[str, Any]:
    return objects.api_group_list()


@router.get(f"/apis/{objects.GROUP}", name="group", include_in_schema=False)
async def group() -> dict[str, Any]:
    return objects.api_group()


@router.get(GROUP_PATH, name="resources", include_in_schema=False)
async def resources() -> dict[str, Any]:
    return objects.api_resource_list()


@router.get("/version", name="version", include_in_schema=False)
async def version(request: Request) -> dict[str, Any]:
    return objects.server_version(request.app.version)


# --- deployments ---------------------------------------------------------------------------------------


def _objects(session: Session, namespace: str) -> list[dict[str, Any]]:
    return [
        objects.deployment_object(deployment, service.scale_of(session, deployment), namespace)
        for deployment in list_deployments(session)
    ]


def _render(items: list[dict[str, Any]], accept: str, *, single: bool) -> dict[str, Any]:
    if objects.wants_table(accept):
        return objects.deployment_table(items, utc_now())
    return items[0] if single else objects.deployment_list(items)


@router.get(f"{GROUP_PATH}/deployments", name="list-all-deployments", include_in_schema=False)
async def list_all(
    db: DatabaseDep, settings: SettingsDep, _: Reader, accept: str = Header("")
) -> dict[str, Any]:
    """Every namespace's deployments (`kubectl get -A`): all of them are in `kube_namespace`."""
    items = await db.run(lambda session: _objects(session, settings.kube_namespace))
    return _render(items, accept, single=False)


@router.get(
    f"{GROUP_PATH}/namespaces/{{namespace}}/deployments", name="list-deployments", include_in_schema=False
)
async def list_in_namespace(
    namespace: str, db: DatabaseDep, settings: SettingsDep, _: Reader, accept: str = Header("")
) -> dict[str, Any]:
    if namespace != settings.kube_namespace:
        return _render([], accept, single=False)  # an empty namespace, as the API server lists one
    items = await db.run(lambda session: _objects(session, namespace))
    return _render(items, accept, single=False)


@router.get(
    f"{GROUP_PATH}/namespaces/{{namespace}}/deployments/{{name}}",
    name="get-deployment",
    include_in_schema=False,
)
async def get_one(
    namespace: str,
    name: DeploymentRefPath,
    db: DatabaseDep,
    settings: SettingsDep,
    _: Reader,
    accept: str = Header(""),
) -> dict[str, Any]:
    _check_namespace(namespace, settings, name)

    def work(session: Session) -> dict[str, Any]:
        deployment = get_deployment(session, ref=name)
        return objects.deployment_object(deployment, service.scale_of(session, deployment), namespace)

    return _render([await db.run(work)], accept, single=True)


# --- the scale subresource -----------------------------------------------------------------------------


async def read_scale(
    namespace: str, name: DeploymentRefPath, db: DatabaseDep, settings: SettingsDep, _: Reader
) -> Scale:
    _check_namespace(namespace, settings, name)
    return _in_namespace(await db.run(lambda session: service.get_scale(session, ref=name)), namespace)


async def replace_scale(
    namespace: str,
    name: DeploymentRefPath,
    body: Scale,
    db: DatabaseDep,
    settings: SettingsDep,
    principal: Scaler,
    response: Response,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Scale:
    _check_namespace(namespace, settings, name)
    if body.metadata.namespace not in (None, namespace):
        raise NamespaceMismatch(
            f"the namespace of the provided object ({body.metadata.namespace}) does not match the "
            f"namespace sent on the request ({namespace})"
        )
    body.metadata.namespace = None
    scale = await write_scale(
        db,
        ref=name,
        new_scale=lambda _session: body,
        principal=principal,
        settings=settings,
        idempotency_key=idempotency_key,
        response=response,
    )
    return _in_namespace(scale, namespace)


async def patch_scale(
    namespace: str,
    name: DeploymentRefPath,
    request: Request,
    db: DatabaseDep,
    settings: SettingsDep,
    principal: Scaler,
    response: Response,
    idempotency_key: IdempotencyKeyHeader = None,
) -> Scale:
    _check_namespace(namespace, settings, name)
    body = await request.body()
    content_type = request.headers.get("content-type", "")

    def patched(session: Session) -> Scale:
        scale = patches.patched_scale(service.get_scale(session, ref=name), content_type, body)
        if scale.metadata.namespace not in (None, namespace):
            raise NamespaceMismatch(f"the patch moves the Scale to namespace {scale.metadata.namespace}")
        scale.metadata.namespace = None
        return scale

    scale = await write_scale(
        db,
        ref=name,
        new_scale=patched,
        principal=principal,
        settings=settings,
        idempotency_key=idempotency_key,
        response=response,
    )
    return _in_namespace(scale, namespace)


for _index, _path in enumerate(SCALE_PATHS):
    _suffix = "" if _index == 0 else "-apps"
    for _endpoint, _method in ((read_scale, "GET"), (replace_scale, "PUT"), (patch_scale, "PATCH")):
        router.add_api_route(
            _path,
            _endpoint,
            methods=[_method],
            name=f"{_method.lower()}-scale{_suffix}",
            response_model=Scale,
            response_model_exclude_none=True,
            include_in_schema=False,
        )
