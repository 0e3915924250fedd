"""Worker extension: methods vLLM mixes into each worker, callable with collective_rpc.

The API process uses it to ask the device-owning processes directly, off the step path, e.g.
for the health endpoint's device memory view.
"""

from __future__ import annotations

from typing import Any


class WardenWorkerExtension:
    def warden_device_memory(self) -> dict[str, Any]:
        """Device memory as this worker sees it (CUDA: allocator numbers; CPU: none)."""
        try:
            import torch

            if torch.cuda.is_available():
                free, total = torch.cuda.mem_get_info()
                return {
                    "device": "cuda",
                    "free_bytes": int(free),
                    "total_bytes": int(total),
                    "allocated_bytes": int(torch.cuda.memory_allocated()),
                    "reserved_bytes": int(torch.cuda.memory_reserved()),
                }
        except Exception as exc:
            return {"device": "unknown", "error": repr(exc)}
        return {"device": "cpu"}
