"""Health endpoints on the serving port (liveness here; readiness and health grow with the
supervisor)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

router = APIRouter()


@router.get("/warden/live")
async def live() -> JSONResponse:
    """The API process is up and its event loop answers: nothing more."""
    return JSONResponse({"live": True})
