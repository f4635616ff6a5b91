"""Assets and generation tasks as a tenant sees them, and deleting an asset.

Every query carries the caller's tenant: another tenant's id answers exactly like a missing
one (404), so ids cannot be probed across tenants. ``DELETE`` closes playback at once (the
gateway checks the asset's state on every request) and leaves the objects to the sweeper.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import msgspec
from aiohttp import web

from aivedio.api import schema
from aivedio.api.auth import tenant_of
from aivedio.api.context import context
from aivedio.api.ids import path_uuid
from aivedio.api.problems import ApiError
from aivedio.api.published import published_files
from aivedio.pipeline.media.credentials import ContentCredentials, content_credentials
from aivedio.pipeline.upkeep.lifecycle import delete_asset
from aivedio.store import asset_reads, task_reads

routes = web.RouteTableDef()


class Output(msgspec.Struct, frozen=True, kw_only=True):
    variant_type: str
    path: str
    mime_type: str
    size_bytes: int
    width: int | None = None
    height: int | None = None


class Asset(msgspec.Struct, frozen=True, kw_only=True):
    asset_id: uuid.UUID
    state: str
    source_type: str
    current_revision: int | None
    moderation: str
    duration_seconds: float | None
    width: int | None
    height: int | None
    video_codec: str | None
    audio_codec: str | None
    source_size_bytes: int | None
    generation_task_id: uuid.UUID | None
    error_class: str | None
    error_detail: str | None
    created_at: datetime
    updated_at: datetime
    outputs: list[Output]
    passthrough: str | None = None
    # Its C2PA provenance: the source's manifest (verified? AI-generated?) and the
    # platform's signing of the published outputs; None until the source was probed.
    content_credentials: ContentCredentials | None = None


class TaskOutput(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    provider_output_id: uuid.UUID
    fetch_status: str
    asset_id: uuid.UUID | None
    error_class: str | None


class GenerationTask(msgspec.Struct, frozen=True, kw_only=True):
    generation_task_id: uuid.UUID
    provider: str
    provider_task_id: str
    status: str
    output_asset_id: uuid.UUID | None
    created_at: datetime
    updated_at: datetime
    outputs: list[TaskOutput]
    passthrough: str | None = None


class Deleted(msgspec.Struct, frozen=True, kw_only=True):
    asset_id: uuid.UUID
    state: str
    deleted_now: bool


@routes.get("/v1/assets/{asset_id}")
async def get_asset(request: web.Request) -> web.Response:
    ctx = context(request)
    tenant = tenant_of(request)
    asset_id = path_uuid(request, "asset_id", "asset")
    row = await asset_reads.tenant_asset(ctx.pool, tenant, asset_id)
    if row is None:
        raise ApiError(404, "no such asset")
    outputs: list[Output] = []
    files: dict[str, dict[str, Any]] = {}
    if row["current_revision"] is not None and row["status"] != "DELETED":
        files = await published_files(ctx.pool, tenant, asset_id, row["current_revision"])
        outputs = [
            Output(
                variant_type=name,
                path=f["path"],
                mime_type=f["mime_type"],
                size_bytes=f["size_bytes"],
                width=f["width"],
                height=f["height"],
            )
            for name, f in sorted(files.items())
        ]
    duration = row["duration_us"] / 1e6 if row["duration_us"] is not None else None
    return schema.encode(
        Asset(
            asset_id=asset_id,
            state=row["status"],
            source_type=row["source_type"],
            current_revision=row["current_revision"],
            moderation=row["moderation_status"],
            duration_seconds=duration,
            width=row["width"],
            height=row["height"],
            video_codec=row["video_codec"],
            audio_codec=row["audio_codec"],
            source_size_bytes=row["source_size_bytes"],
            generation_task_id=row["generation_task_id"],
            error_class=row["last_error_class"],
            error_detail=row["last_error_detail"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            outputs=outputs,
            passthrough=row["passthrough"],
            content_credentials=content_credentials(
                row["provenance"], {name: f["c2pa"] for name, f in files.items()}
            ),
        )
    )


@routes.delete("/v1/assets/{asset_id}")
async def remove_asset(request: web.Request) -> web.Response:
    ctx = context(request)
    asset_id = path_uuid(request, "asset_id", "asset")
    if not await asset_reads.tenant_owns_asset(ctx.pool, tenant_of(request), asset_id):
        raise ApiError(404, "no such asset")
    deleted_now = await delete_asset(ctx.pool, asset_id, reason="api")
    return schema.encode(Deleted(asset_id=asset_id, state="DELETED", deleted_now=deleted_now))


@routes.get("/v1/generation-tasks/{task_id}")
async def get_task(request: web.Request) -> web.Response:
    ctx = context(request)
    tenant = tenant_of(request)
    task_id = path_uuid(request, "task_id", "generation task")
    found = await task_reads.tenant_task_with_outputs(ctx.pool, tenant, task_id)
    if found is None:
        raise ApiError(404, "no such generation task")
    task, outputs = found
    return schema.encode(
        GenerationTask(
            generation_task_id=task_id,
            provider=task["provider"],
            provider_task_id=task["provider_task_id"],
            status=task["provider_status"],
            output_asset_id=task["output_asset_id"],
            created_at=task["created_at"],
            updated_at=task["updated_at"],
            outputs=[
                TaskOutput(
                    index=o["output_index"],
                    provider_output_id=o["id"],
                    fetch_status=o["fetch_status"],
                    asset_id=o["asset_id"],
                    error_class=o["last_error_class"],
                )
                for o in outputs
            ],
            passthrough=task["passthrough"],
        )
    )


def _paths() -> dict[str, Any]:
    asset = schema.path_param("asset_id", "the asset id")
    asset_id = "$response.body#/asset_id"
    # An asset's id is its video's id (an upload's, or a provider output's).
    of_asset = {
        "getVideoStatus": schema.link(
            "getVideoStatus", "its state and timeline", {"video_id": asset_id}
        ),
        "getVideoPlayback": schema.link(
            "getVideoPlayback", "its playback URLs", {"video_id": asset_id}
        ),
        "streamAssetEvents": schema.link(
            "streamAssetEvents", "its stage changes", {"asset_id": asset_id}
        ),
    }
    of_task = {
        "getAsset": schema.link(
            "getAsset",
            "the asset made from the task's output",
            {"asset_id": "$response.body#/output_asset_id"},
        )
    }
    return {
        "/v1/assets/{asset_id}": {
            "get": {
                "summary": "An asset: state, media summary, published outputs",
                "description": "A deleted asset answers with its state, DELETED.",
                "operationId": "getAsset",
                "tags": ["assets"],
                "parameters": [asset],
                "responses": schema.responses(
                    {"200": {**schema.ok_json(Asset), "links": of_asset}}, 404, 503
                ),
            },
            "delete": {
                "summary": "Delete an asset: playback closes at once",
                "operationId": "deleteAsset",
                "tags": ["assets"],
                "parameters": [asset],
                "responses": schema.responses({"200": schema.ok_json(Deleted)}, 404, 503),
            },
        },
        "/v1/generation-tasks/{task_id}": {
            "get": {
                "summary": "A generation task and its outputs",
                "operationId": "getGenerationTask",
                "tags": ["assets"],
                "parameters": [schema.path_param("task_id", "the generation task id")],
                "responses": schema.responses(
                    {"200": {**schema.ok_json(GenerationTask), "links": of_task}}, 404, 503
                ),
            },
        },
    }


PATHS = _paths()
SCHEMAS: tuple[type, ...] = (Asset, GenerationTask, Deleted)
