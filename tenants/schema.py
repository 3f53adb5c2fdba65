"""OpenAPI description of Ductor's authentication (loaded by ``TenantsConfig.ready``)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.auth.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "dct_<prefix>_<secret>",
            "description": "A tenant API key, or a platform key (dctp_...) for platform endpoints.",
        }
