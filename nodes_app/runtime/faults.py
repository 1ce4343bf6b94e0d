"""What the runtime reports: a refused request (an HTTP status and a code), or its own fault.

Errors about a model's weights are the registry's too: ``nodes_app.shared.model_errors``.
"""

from __future__ import annotations

from nodes_app.protocol.errors import ProtocolError


class RuntimeRequestError(Exception):
    """A request the node refuses; rendered as ``{"error": {"message", "type", "code"}}``."""

    def __init__(
        self,
        message: str,
        *,
        code: str,
        status: int = 400,
        error_type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.error_type = error_type

    @classmethod
    def refusing(cls, error: ProtocolError) -> RuntimeRequestError:
        """The 400 a node answers to input that breaks the protocol."""
        return cls(error.message, code=error.code)

    def as_json(self) -> dict[str, dict[str, str]]:
        return {"error": {"message": self.message, "type": self.error_type, "code": self.code}}


class NonFiniteOutput(Exception):
    """This node computed NaN or infinite values (hidden states or logits): its own fault."""
