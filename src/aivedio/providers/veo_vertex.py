"""Google Veo on Vertex AI: a long-running operation; the videos land in the caller's bucket.

The task id is the operation's full name
(``projects/P/locations/L/publishers/google/models/M/operations/OP``), read with
``POST {model}:fetchPredictOperation``. Outputs are ``response.gcsUris[]`` (or
``response.videos[].gcsUri``) in the caller's own bucket: downloaded through the GCS JSON
API (``download_base_url``, by default https://storage.googleapis.com) with the configured
access token, sent to that origin only. They last as long as the bucket's policy says, so
the URL never needs re-issuing: a refresh reads the operation again. No webhook exists.
Cadence: not documented; we assume 10 s.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from aivedio.errors import InvalidResponseError
from aivedio.providers.base import VendorAdapter, origin, text
from aivedio.providers.operations import operation_path, operation_status
from aivedio.providers.seam import ProviderOutput, ProviderTask

GCS_BASE_URL = "https://storage.googleapis.com"


class VeoVertexAdapter(VendorAdapter):
    kind = "veo_vertex"
    default_api_base_url = "https://us-central1-aiplatform.googleapis.com"
    default_poll_interval_seconds = 10.0
    default_poll_jitter_seconds = 2.0

    @property
    def gcs_base(self) -> str:
        return (self.config.download_base_url or GCS_BASE_URL).rstrip("/")

    @classmethod
    def check_task_id(cls, task_id: str) -> None:
        operation_path(task_id, "projects")

    async def get_task(self, task_id: str) -> ProviderTask:
        model = operation_path(task_id, "projects").rpartition("/operations/")[0]
        doc = await self.call(
            "POST",
            self.api_url(f"/v1/{model}:fetchPredictOperation"),
            json_body={"operationName": task_id},
        )
        status = operation_status(doc)
        outputs: list[ProviderOutput] = []
        if status == "SUCCEEDED":
            expires = self.expiry()
            outputs = [
                ProviderOutput(index=i, url=self.download_url(uri), expires_at=expires)
                for i, uri in enumerate(_gcs_uris(doc["response"]))
            ]
        return ProviderTask(provider_task_id=text(doc, "name"), status=status, outputs=outputs)

    def download_url(self, gcs_uri: str) -> str:
        bucket, sep, name = gcs_uri.removeprefix("gs://").partition("/")
        if not gcs_uri.startswith("gs://") or not sep or not bucket or not name:
            raise InvalidResponseError("vertex output is not a gs://bucket/object URI")
        return (
            f"{self.gcs_base}/download/storage/v1/b/{quote(bucket, safe='')}"
            f"/o/{quote(name, safe='')}?alt=media"
        )

    def credential_origins(self) -> set[tuple[str, str, int]]:
        return {origin(self.gcs_base)}

    def download_credentials(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.config.api_key}"}


def _gcs_uris(response: dict[str, Any]) -> list[str]:
    uris = response.get("gcsUris")
    if uris is None and isinstance(response.get("videos"), list):
        uris = [v.get("gcsUri") for v in response["videos"] if isinstance(v, dict)]
    if not isinstance(uris, list) or not uris or not all(isinstance(u, str) for u in uris):
        raise InvalidResponseError("vertex operation: no gcsUris")
    return uris
