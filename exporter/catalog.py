"""The one catalog of metric names: warden's own, and the vLLM metrics warden builds on.

Dashboards, alerts, tests and the exporter import these specs; nobody retypes a metric name.
``MetricSpec.name`` is the series name as it appears on ``/metrics`` (counters end in
``_total``, histograms are the base name of their ``_bucket``/``_sum``/``_count`` series).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["counter", "gauge", "histogram"]
Owner = Literal["warden", "vllm", "alertmanager"]

# Levels of warden_memory_watermark, in order of severity.
WATERMARK_LEVELS: tuple[str, ...] = ("normal", "high", "critical", "oom_imminent")
# warden_memory_utilization_ratio{source}: raw used fractions, for dashboards and trends.
MEMORY_SOURCES: tuple[str, ...] = ("device", "torch_reserved")
# warden_memory_risk_ratio{source}: memory beyond the engine's plan, what the watermark reads
# (exporter/memory_risk.py, and exporter/host_memory.py for the engine processes' own host
# memory). The KV cache is not one: a full cache is vLLM at work, not a risk.
MEMORY_RISK_SOURCES: tuple[str, ...] = ("device", "allocator", "host")
# What bounds the engine's host memory (warden_host_memory_limit_bytes{limit}): a cgroup's
# memory limit, a limit declared in WARDEN_HOST_MEMORY_LIMIT_BYTES, or the machine's memory
# less WARDEN_HOST_MEMORY_RESERVE_BYTES.
HOST_LIMIT_KINDS: tuple[str, ...] = ("cgroup", "declared", "machine")
ERROR_CLASSES: tuple[str, ...] = ("oom", "cuda_driver", "other")
NONFINITE_KINDS: tuple[str, ...] = ("nan", "inf")
DEGRADATION_ACTIONS: tuple[str, ...] = (
    "stop_admission",
    "cap_max_tokens",
    "shed_low_priority",
    "reject_all",
    "circuit_breaker",
    "enforce_eager",
)
LEASE_SOURCES: tuple[str, ...] = ("alertmanager", "reflex", "manual")
REQUEST_OUTCOMES: tuple[str, ...] = ("success", "client_error", "server_error", "rejected")
ADMISSION_REASONS: tuple[str, ...] = (
    "circuit_open",
    "circuit_half_open",
    "reject_all",
    "stop_admission",
    "shed_low_priority",
    "saturated",
    "kv_never_fits",
    # under a cap: the request asks for more sequences (n x prompts) than the cap has tokens
    "cap_max_tokens",
)
# What a refusal can name as its cause (the ``warden_signal`` of the error body): the memory
# watermark, a saturation signal, an alert (its alertname) or a manual override.
SATURATION_SIGNALS: tuple[str, ...] = ("latency_s", "queue_wait_s", "queue_depth")
WEBHOOK_OUTCOMES: tuple[str, ...] = (
    "applied",
    "unauthorized",
    "disabled",
    "malformed",
    "error",
    "unknown_action",
    # An alert about another engine (its identity labels name someone else) or about the fleet
    # (no instance label): counted per alert, changes nothing here.
    "not_for_this_engine",
    # An alert refused on its own (malformed, past a bound, times beyond the clock skew):
    # counted per alert; the notification's other alerts still apply.
    "invalid_alert",
    # A protective alert (reject_all, stop_admission) evicted a less protective lease to fit.
    "lease_evicted",
)
# warden relay (one Alertmanager receiver for a fleet; warden/relay/): what became of each
# notification, of each alert in it, and of each POST to an engine's webhook.
RELAY_NOTIFICATION_OUTCOMES: tuple[str, ...] = (
    "forwarded",  # every alert for an engine reached it (or needed no engine)
    "failed",  # an engine refused or could not be reached after the retries: answered 502
    "unauthorized",
    "malformed",
    "resolver_error",  # the engine list could not be read: answered 503, Alertmanager retries
)
RELAY_ALERT_OUTCOMES: tuple[str, ...] = (
    "forwarded",  # sent to the one engine its identity labels name
    "fleet_wide",  # no instance label: about the fleet, applied by no engine
    "unresolved",  # no engine of that identity is known (scaled away): dropped
    "ambiguous",  # several engines match its labels: dropped, add identity labels
    "invalid",  # malformed or past a bound (docs/security.md): refused on its own, dropped
)
RELAY_DELIVERY_OUTCOMES: tuple[str, ...] = (
    "delivered",  # the engine answered 2xx
    "retried",  # an attempt failed transiently (5xx, timeout, connection) and was retried
    "failed",  # still failing after the last attempt
    "refused",  # the engine answered 4xx (token, payload): not retried
)
RETRY_REASONS: tuple[str, ...] = ("warden_preemption", "engine_oom", "nonfinite_logits", "timeout")
# Why the supervisor restarted the engine (warden_engine_restarts_total{reason}): the server
# exited on its own; a vLLM process was killed or vanished; stalled with requests pending; vLLM
# says dead/poisoned or does not answer; switched to --enforce-eager; a person asked for it;
# memory beyond the engine's plan neared its limit (drained and restarted before the OOM).
RESTART_REASONS: tuple[str, ...] = (
    "exit",
    "crash",
    "stalled",
    "unhealthy",
    "enforce_eager",
    "manual",
    "memory",
)
# warden_circuit_breaker_state values.
CIRCUIT_STATES: tuple[str, ...] = ("closed", "half_open", "open")


# Labels on alerts that the engine webhook reads: the action, and its parameters.
ACTION_LABEL = "warden_action"
PARAM_MAX_TOKENS = "warden_max_tokens"  # cap_max_tokens: the cap (int)
PARAM_PRIORITY_THRESHOLD = "warden_priority_threshold"  # shed: refuse priority > this (int)
PARAM_RETRY_AFTER = "warden_retry_after"  # reject_all / stop_admission: Retry-After seconds
PARAM_CIRCUIT = "warden_circuit"  # circuit_breaker: half_open | open
PARAM_ADMIT_FRACTION = "warden_admit_fraction"  # circuit_breaker half_open: fraction admitted
PARAM_PREEMPT = "warden_preempt"  # "1": also preempt the request holding the most KV blocks
ACTION_PARAM_LABELS: tuple[str, ...] = (
    PARAM_MAX_TOKENS,
    PARAM_PRIORITY_THRESHOLD,
    PARAM_RETRY_AFTER,
    PARAM_CIRCUIT,
    PARAM_ADMIT_FRACTION,
    PARAM_PREEMPT,
)
# Series Prometheus itself provides, allowed in expressions besides the catalog.
PROMETHEUS_BUILTINS: frozenset[str] = frozenset({"up", "ALERTS", "ALERTS_FOR_STATE"})


@dataclass(frozen=True)
class MetricSpec:
    """One metric: what it is called, what it measures, and how it is labelled.

    ``multiprocess_mode`` says how a gauge written by several vLLM processes is merged when
    ``PROMETHEUS_MULTIPROC_DIR`` is set; ``gpu_only`` marks series a CPU engine never has;
    ``unit`` is the Grafana unit dashboards use for it.
    """

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    owner: Owner = "warden"
    unit: str = "short"
    multiprocess_mode: str = "mostrecent"
    gpu_only: bool = False
    buckets: tuple[float, ...] = field(default=())

    @property
    def base(self) -> str:
        """Name without the ``_total`` suffix, as prometheus_client and recording rules want."""
        if self.kind == "counter" and self.name.endswith("_total"):
            return self.name[: -len("_total")]
        return self.name

    def __str__(self) -> str:
        return self.name


def _w(name: str, kind: Kind, help: str, *labels: str, **kw: object) -> MetricSpec:
    return MetricSpec(name, kind, help, tuple(labels), "warden", **kw)  # type: ignore[arg-type]


def _v(name: str, kind: Kind, help: str, *labels: str, **kw: object) -> MetricSpec:
    return MetricSpec(name, kind, help, tuple(labels), "vllm", **kw)  # type: ignore[arg-type]


# --- Memory -------------------------------------------------------------------------------
MEMORY_WATERMARK = _w(
    "warden_memory_watermark",
    "gauge",
    "Memory pressure level from the worst signal: 0 normal, 1 high, 2 critical, 3 oom_imminent.",
    unit="none",
    multiprocess_mode="max",
)
MEMORY_WATERMARK_PEAK = _w(
    "warden_memory_watermark_peak",
    "gauge",
    "Highest watermark level within the last peak window (15 s by default): a spike the reflex "
    "absorbs between two scrapes still shows.",
    unit="none",
    multiprocess_mode="max",
)
MEMORY_UTILIZATION = _w(
    "warden_memory_utilization_ratio",
    "gauge",
    "Used fraction of the device per source, raw: device (NVML used: this engine's processes "
    "where NVML says, see warden_memory_device_risk_scope), torch_reserved. Near "
    "gpu_memory_utilization (0.92) on a healthy engine; the watermark reads the risk instead.",
    "source",
    unit="percentunit",
    multiprocess_mode="max",
    gpu_only=True,
)
MEMORY_RISK = _w(
    "warden_memory_risk_ratio",
    "gauge",
    "Memory in use beyond the engine's plan, as a share of the headroom the plan left: 0 within "
    "the plan, 1 full. device = NVML used (scope: warden_memory_device_risk_scope), allocator = "
    "PyTorch reserved (of the device), host = the engine processes' unique host memory (of the "
    "cgroup, declared or machine limit).",
    "source",
    unit="percentunit",
    multiprocess_mode="max",
)
MEMORY_PLANNED = _w(
    "warden_memory_planned_bytes",
    "gauge",
    "Device memory the engine planned to use: vLLM's budget (gpu_memory_utilization x total) "
    "plus what was in use before it started, or the peak it settled at if that is higher.",
    "gpu",
    unit="bytes",
    gpu_only=True,
)
HOST_MEMORY_USED = _w(
    "warden_host_memory_used_bytes",
    "gauge",
    "Host memory the engine's processes (API server, engine core, workers) hold on their own: "
    "the sum of their unique set sizes, shared pages not counted twice.",
    unit="bytes",
)
HOST_MEMORY_LIMIT = _w(
    "warden_host_memory_limit_bytes",
    "gauge",
    "The host memory limit that would really stop the engine, by what sets it: cgroup (memory "
    "limit of its cgroup), declared (WARDEN_HOST_MEMORY_LIMIT_BYTES), machine (memory less "
    "the reserve).",
    "limit",
    unit="bytes",
)
HOST_MEMORY_PLANNED = _w(
    "warden_host_memory_planned_bytes",
    "gauge",
    "The engine processes' settled host footprint: the peak they reached while the engine "
    "settled after start-up. Growth beyond it is what the host risk measures.",
    unit="bytes",
)
WATERMARK_TRANSITIONS = _w(
    "warden_memory_watermark_transitions_total",
    "counter",
    "Changes of the memory watermark, by the level entered.",
    "to",
)
SOURCE_AVAILABLE = _w(
    "warden_source_available",
    "gauge",
    "1 when a measurement source (nvml, torch_allocator, cudagraph, kv_cache, host_memory) can "
    "be read here.",
    "source",
    unit="bool",
    multiprocess_mode="max",
)
GPU_MEMORY_USED = _w(
    "warden_gpu_memory_used_bytes",
    "gauge",
    "Device memory in use on the GPU, all processes (NVML).",
    "gpu",
    unit="bytes",
    gpu_only=True,
)
GPU_MEMORY_ENGINE_USED = _w(
    "warden_gpu_memory_engine_used_bytes",
    "gauge",
    "Device memory in use by this engine's own processes (NVML per process), where NVML says.",
    "gpu",
    unit="bytes",
    gpu_only=True,
)
MEMORY_DEVICE_RISK_SCOPE = _w(
    "warden_memory_device_risk_scope",
    "gauge",
    "What the device memory risk counts: 1 this engine's own processes (NVML per process), 0 "
    "every process on the device (NVML gives no per-process usage for this engine here).",
    "gpu",
    unit="none",
    gpu_only=True,
)
GPU_MEMORY_TOTAL = _w(
    "warden_gpu_memory_total_bytes",
    "gauge",
    "Device memory size of the GPU (NVML).",
    "gpu",
    unit="bytes",
    gpu_only=True,
)
TORCH_ALLOCATED = _w(
    "warden_torch_allocated_bytes",
    "gauge",
    "Bytes held by live tensors in PyTorch's caching allocator, in the process owning the device.",
    "device",
    unit="bytes",
    gpu_only=True,
)
TORCH_RESERVED = _w(
    "warden_torch_reserved_bytes",
    "gauge",
    "Bytes PyTorch's caching allocator reserved from the device; minus allocated = cached gap.",
    "device",
    unit="bytes",
    gpu_only=True,
)
TORCH_DEVICE_TOTAL = _w(
    "warden_torch_device_total_bytes",
    "gauge",
    "Total memory of the device as PyTorch sees it (cudaMemGetInfo).",
    "device",
    unit="bytes",
    gpu_only=True,
)
TORCH_ALLOC_RETRIES = _w(
    "warden_torch_alloc_retries_total",
    "counter",
    "Allocations that failed once and succeeded after the allocator flushed its cache.",
    "device",
    gpu_only=True,
)
TORCH_OOM = _w(
    "warden_torch_oom_total",
    "counter",
    "Out-of-memory errors raised by PyTorch's caching allocator.",
    "device",
    gpu_only=True,
)
CUDAGRAPH_CAPTURES = _w(
    "warden_cudagraph_captures_total",
    "counter",
    "CUDA graphs captured by this engine (start-up and any later lazy capture).",
    gpu_only=True,
)
CUDAGRAPH_POOL_BYTES = _w(
    "warden_cudagraph_pool_bytes",
    "gauge",
    "Device memory taken by captured CUDA graphs (their memory pool).",
    unit="bytes",
    gpu_only=True,
)

# --- Faults -------------------------------------------------------------------------------
NONFINITE_LOGITS = _w(
    "warden_nonfinite_logits_total",
    "counter",
    "Requests whose logits held NaN or Inf (each request counted once, by the first kind seen).",
    "kind",
)
NONFINITE_FLAG_WAIT = _w(
    "warden_nonfinite_flag_wait_seconds",
    "histogram",
    "How long the middleware held a finished response until the engine had checked every logits "
    "step up to its end for NaN/Inf (0 on CPU; on a GPU the flags reach the host after the step).",
    unit="s",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0),
)
ENGINE_ERRORS = _w(
    "warden_engine_errors_total",
    "counter",
    "Exceptions from model execution: oom (recoverable), cuda_driver (context poisoned), other.",
    "class",
)
ENGINE_LAST_STEP = _w(
    "warden_engine_last_step_timestamp_seconds",
    "gauge",
    "Unix time of the last engine step that produced output.",
    unit="dateTimeAsIso",
    multiprocess_mode="max",
)
ENGINE_STALLED = _w(
    "warden_engine_stalled",
    "gauge",
    "1 when requests are running or waiting and no step has completed within the stall timeout.",
    unit="bool",
    multiprocess_mode="max",
)
ENGINE_HANG_THRESHOLD = _w(
    "warden_engine_hang_threshold_seconds",
    "gauge",
    "A step running longer than this is hung: learned from this engine's longest steps "
    "(a multiple, with a floor), WARDEN_STALL_MAX_STEP_S until learned and at most that.",
    unit="s",
    multiprocess_mode="max",
)
ENGINE_CPU_WAIT = _w(
    "warden_engine_cpu_wait_seconds_total",
    "counter",
    "Seconds the engine's processes were ready to run but waited for a CPU (the largest wait "
    "among them at each reading): a starved engine is slow, not hung, and the stall check "
    "takes this wait off a step's age. Normal: near 0; climbing means CPU contention.",
    unit="s",
)
COLLECTOR_ERRORS = _w(
    "warden_collector_errors_total",
    "counter",
    "Exceptions raised by a warden collector; the collector is skipped, the engine is unaffected.",
    "collector",
)
EXPORTER_INFO = _w(
    "warden_exporter_info",
    "gauge",
    "Always 1; labels name the warden version and the device type of the engine.",
    "version",
    "device",
    unit="none",
    multiprocess_mode="max",
)

# --- Degradation and admission (the closed loop) ------------------------------------------
DEGRADATION_ACTIVE = _w(
    "warden_degradation_active",
    "gauge",
    "1 while a degradation action is in effect (value of the action where it has one).",
    "action",
    unit="none",
    multiprocess_mode="max",
)
DEGRADATION_LEASES = _w(
    "warden_degradation_leases",
    "gauge",
    "Live degradation leases by who holds them: alertmanager, reflex, manual.",
    "source",
    unit="none",
    multiprocess_mode="max",
)
ADMISSION_REJECTIONS = _w(
    "warden_admission_rejections_total",
    "counter",
    "Requests refused by warden admission control, by reason.",
    "reason",
)
MAX_TOKENS_CAPPED = _w(
    "warden_max_tokens_capped_total",
    "counter",
    "Requests whose max_tokens was lowered by a cap_max_tokens action or the KV forecast.",
)
WEBHOOK_NOTIFICATIONS = _w(
    "warden_webhook_notifications_total",
    "counter",
    "Alertmanager notifications received by the engine webhook, by outcome.",
    "outcome",
)
REQUEST_RETRIES = _w(
    "warden_request_retries_total",
    "counter",
    "Requests retried by warden after a transient failure, by reason.",
    "reason",
)
REQUEST_RETRIES_EXHAUSTED = _w(
    "warden_request_retries_exhausted_total",
    "counter",
    "Requests that still failed after the last retry, by reason.",
    "reason",
)
CIRCUIT_BREAKER_STATE = _w(
    "warden_circuit_breaker_state",
    "gauge",
    "Admission circuit breaker: 0 closed, 1 half_open, 2 open.",
    unit="none",
    multiprocess_mode="max",
)
REQUESTS = _w(
    "warden_requests_total",
    "counter",
    "Inference requests seen by warden's admission middleware, by outcome.",
    "outcome",
)
REFLEX_ACTIONS = _w(
    "warden_reflex_actions_total",
    "counter",
    "Leases taken by the in-engine reflex, by action.",
    "action",
)
WARDEN_PREEMPTIONS = _w(
    "warden_preemptions_total",
    "counter",
    "Requests preempted by warden to relieve memory pressure.",
)

# --- Saturation (what queueing costs users; warden/control/admission.py decides from it) ----
SATURATION_STATES: tuple[str, ...] = ("normal", "saturated")
QUEUE_WAIT_PREDICTED = _w(
    "warden_queue_wait_predicted_seconds",
    "gauge",
    "How long a typical request arriving now would wait in vLLM's queue: for a slot in the "
    "running batch, until its requests end; deeper, until the queued requests ahead of it "
    "have each held a slot for their own max_tokens (both with a saturation limit set, from "
    "how long each running request has run and what each may generate); else whole batches "
    "at the drain rate: the prediction admission's saturation judge decides on (for the "
    "first slots a full batch frees, under a latency SLO, together with the service time: "
    "their sum's 99th percentile). 0 when nothing waits.",
    unit="s",
    multiprocess_mode="max",
)
DRAIN_RATE = _w(
    "warden_drain_rate_per_second",
    "gauge",
    "Requests the engine finishes per second, over its recent completions (what the queue "
    "wait and Retry-After are computed from).",
    unit="reqps",
    multiprocess_mode="max",
)
SERVICE_TIME = _w(
    "warden_service_time_seconds",
    "gauge",
    "Service time (end to end minus queue) forecast for a request arriving now: the 99th "
    "percentile of recent requests' service times, preemptions and recomputation included, "
    "each scaled down by the step times now when the batch the request will be served in is "
    "smaller than the one it was served in: what admission forecasts the latency of a request "
    "that does not say how many tokens it wants with (one that does: each recent time cut to "
    "its max_tokens where the recent request generated more).",
    unit="s",
    multiprocess_mode="max",
)
LATENCY_SLO = _w(
    "warden_latency_slo_seconds",
    "gauge",
    "The latency SLO admission protects (admission.saturation.latency_slo_s); 0 when none is "
    "set and saturation never refuses.",
    unit="s",
    multiprocess_mode="max",
)
SATURATED = _w(
    "warden_saturated",
    "gauge",
    "1 while a typical new request would miss the latency SLO or queue limit, so admission "
    "refuses new requests with a computed Retry-After; held 20 s after it clears.",
    unit="bool",
    multiprocess_mode="max",
)
SATURATION_TRANSITIONS = _w(
    "warden_saturation_transitions_total",
    "counter",
    "Changes of the saturation state, by the state entered (saturated, normal).",
    "to",
)
# Whether an admitted request kept the latency SLO admission promised it.
SLO_OUTCOMES: tuple[str, ...] = ("within", "missed")
ADMITTED_SLO = _w(
    "warden_admitted_slo_total",
    "counter",
    "Requests admitted while a latency SLO is set, by whether they were answered within it "
    "(within, missed), timed from admission to the response's last byte: whether admission "
    "keeps the promise it admits on.",
    "outcome",
)

# --- warden relay (Alertmanager -> the engine an alert is about) ----------------------------
RELAY_NOTIFICATIONS = _w(
    "warden_relay_notifications_total",
    "counter",
    "Alertmanager notifications received by warden relay, by outcome.",
    "outcome",
)
RELAY_ALERTS = _w(
    "warden_relay_alerts_total",
    "counter",
    "Alerts in the relay's notifications, by what it did with each: forwarded, fleet_wide...",
    "outcome",
)
RELAY_DELIVERIES = _w(
    "warden_relay_deliveries_total",
    "counter",
    "The relay's POSTs to engine webhooks, by outcome: delivered, retried, failed, refused.",
    "outcome",
)
RELAY_ENGINES = _w(
    "warden_relay_engines",
    "gauge",
    "Engines the relay can address: engine targets in Prometheus's last active target list.",
    unit="none",
)

# --- Supervisor ---------------------------------------------------------------------------
ENGINE_RESTARTS = _w(
    "warden_engine_restarts_total",
    "counter",
    "Engine restarts by the supervisor, by reason (exit, crash, stalled, enforce_eager...).",
    "reason",
)
ENGINE_RESTART_DURATION = _w(
    "warden_engine_restart_duration_seconds",
    "histogram",
    "Time from engine failure to ready again.",
    unit="s",
    buckets=(5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0),
)
SUPERVISOR_CIRCUIT_OPEN = _w(
    "warden_supervisor_circuit_open",
    "gauge",
    "1 when restarts hit the limit for the window and the supervisor stopped restarting.",
    unit="bool",
    multiprocess_mode="max",
)
ENGINE_READY = _w(
    "warden_engine_ready",
    "gauge",
    "1 when the engine passes every readiness check.",
    unit="bool",
    multiprocess_mode="max",
)
ENGINE_HEALTHY = _w(
    "warden_engine_healthy",
    "gauge",
    "1 when vLLM says the engine is healthy (/health, and /fault_tolerance/status where on).",
    unit="bool",
    multiprocess_mode="max",
)
ENGINE_EAGER_MODE = _w(
    "warden_engine_eager_mode",
    "gauge",
    "1 when warden restarted the engine with --enforce-eager (CUDA graphs off).",
    unit="bool",
    multiprocess_mode="max",
)

MEMORY_RESTART_RISK = _w(
    "warden_memory_restart_risk",
    "gauge",
    "Memory risk at which the supervisor drains and restarts the engine, by risk source: "
    "lower than usual while a memory creep that made it restart before is remembered "
    "(undo: DELETE /supervisor/memory).",
    "source",
    unit="percentunit",
    multiprocess_mode="max",
)

# --- vLLM's own metrics that warden reuses (documented names, 0.32) -----------------------
VLLM_KV_CACHE_USAGE = _v(
    "vllm:kv_cache_usage_perc", "gauge", "KV cache usage, 1 = full.", unit="percentunit"
)
VLLM_NUM_REQUESTS_RUNNING = _v("vllm:num_requests_running", "gauge", "Requests in the batch.")
VLLM_NUM_REQUESTS_WAITING = _v("vllm:num_requests_waiting", "gauge", "Requests in the queue.")
VLLM_NUM_PREEMPTIONS = _v(
    "vllm:num_preemptions_total", "counter", "Requests preempted by the scheduler."
)
VLLM_REQUEST_SUCCESS = _v(
    "vllm:request_success_total", "counter", "Finished requests by reason.", "finished_reason"
)
VLLM_PROMPT_TOKENS = _v("vllm:prompt_tokens_total", "counter", "Prefill tokens processed.")
VLLM_GENERATION_TOKENS = _v("vllm:generation_tokens_total", "counter", "Tokens generated.")
VLLM_TTFT = _v("vllm:time_to_first_token_seconds", "histogram", "Time to first token.", unit="s")
VLLM_INTER_TOKEN_LATENCY = _v(
    "vllm:inter_token_latency_seconds", "histogram", "Time between output tokens.", unit="s"
)
VLLM_E2E_LATENCY = _v(
    "vllm:e2e_request_latency_seconds",
    "histogram",
    "End-to-end request latency.",
    unit="s",
    # vLLM 0.32's REQUEST_LATENCY_BUCKETS (vllm/v1/metrics/buckets.py): SLOs must be one of them.
    buckets=(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
    + (120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
)
VLLM_QUEUE_TIME = _v(
    "vllm:request_queue_time_seconds", "histogram", "Time requests spent waiting.", unit="s"
)
VLLM_ADMISSION_REJECTIONS = _v(
    "vllm:admission_rejections_total", "counter", "Requests vLLM's own queue limits refused."
)
VLLM_CACHE_CONFIG_INFO = _v("vllm:cache_config_info", "gauge", "KV cache configuration.")
VLLM_CORRUPTED_REQUESTS = _v(
    "vllm:corrupted_requests_total",
    "counter",
    "Requests with NaN logits (VLLM_COMPUTE_NANS_IN_LOGITS=1 only).",
)

# --- Alertmanager's own metric that warden's delivery alert watches -------------------------
ALERTMANAGER_NOTIFICATIONS_FAILED = MetricSpec(
    "alertmanager_notifications_failed_total",
    "counter",
    "Notifications Alertmanager failed to deliver, by integration (webhook, email...).",
    ("integration",),
    "alertmanager",
)

ALL: tuple[MetricSpec, ...] = tuple(
    v for v in list(globals().values()) if isinstance(v, MetricSpec)
)
WARDEN: tuple[MetricSpec, ...] = tuple(m for m in ALL if m.owner == "warden")
VLLM: tuple[MetricSpec, ...] = tuple(m for m in ALL if m.owner == "vllm")
BY_NAME: dict[str, MetricSpec] = {m.name: m for m in ALL}


def series_names(spec: MetricSpec) -> tuple[str, ...]:
    """Every series name a metric exposes (histograms expose three)."""
    if spec.kind == "histogram":
        return (f"{spec.name}_bucket", f"{spec.name}_sum", f"{spec.name}_count")
    return (spec.name,)


KNOWN_SERIES: frozenset[str] = frozenset(s for m in ALL for s in series_names(m))
