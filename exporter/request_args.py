"""Names of the per-request arguments (``vllm_xargs``) warden passes to the engine.

Kept apart from the logits processor so light tools (chaos, the middleware) can use them
without importing torch and vLLM.
"""

RID_ARG = "warden_rid"  # warden's request id: ties a non-finite flag back to the request
ATTEMPT_ARG = "warden_attempt"  # 1 for the first try; retries count up
INJECT_ARG = "warden_inject"  # test switch only: "nan" or "inf" poisons this request's logits
INJECT_ATTEMPTS_ARG = "warden_inject_attempts"  # poison this many attempts (default 1)
RAISE_ARG = "warden_raise"  # test switch only: "oom" | "cuda_driver" | "other" raises in the step
HANG_ARG = "warden_hang"  # test switch only: the engine step that finds this request never ends
BUSY_ARG = "warden_busy_s"  # test switch only: each step with this request computes this long
