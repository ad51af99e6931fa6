"""Names that more than one module writes or reads: the MLflow tags of a sweep's runs (the UI, the registry, the
ledger and the review find runs by them, so a rename here is a rename of every logged run's tag)."""


class Tag:
    # what a run is, and where it belongs
    KIND = "roi.kind"                        # sweep | rung | endpoint-bench
    SWEEP = "roi.sweep"
    TARGET = "roi.target"
    PROFILE = "roi.profile"
    RUNG = "roi.rung"
    COST = "roi.cost"
    AIM = "roi.aim"                          # speed | memory: what the rung's gate asks of it
    MODEL = "roi.model"
    MODEL_DIR = "roi.model_dir"
    ENDPOINT = "roi.endpoint"
    SERVER = "roi.server."                   # + engine, version, command, ...: a serving engine's server
    PROMPT_FORMAT = "roi.prompt_format"
    TOKENIZER = "roi.tokenizer"              # the folder whose tokenizer made an endpoint bench's prompts
    QUEUE_MODEL_SPLIT = "roi.queue_model_split"
    # a rung's outcome
    VERDICT = "roi.verdict"
    REASON = "roi.reason"
    DECISION = "roi.decision"
    CHAMPION_BEFORE = "roi.champion_before"
    REVERTED_TO = "roi.reverted_to"
    SUPERSEDED = "roi.superseded"
    ARTEFACT_REUSED = "roi.artefact_reused"
    SCORES_REUSED_FROM = "roi.scores_reused_from"
    MEASUREMENT = "roi.measurement"
    ISOLATION = "roi.isolation"
    FIDELITY = "roi.fidelity"
    CAPACITY = "roi.capacity"
    SOAK = "roi.soak"
    SOAK_GPU = "roi.soak.gpu"
    SOAK_FOLLOWUP = "roi.soak.followup"      # `roi-ladder soak`: a longer soak of a rung whose own did not decide
    GATE = "roi.gate."                       # + a gate criterion's name
    GATE_FIRST_MEASUREMENT = "roi.gate.first_measurement"
    GATE_RECORDED_AGAIN = "roi.gate.recorded_again"   # a side's recorded run measured again: rounds disagreed with it
    GATE_INTERLEAVED = "roi.gate.interleaved"
    MACHINE_LOAD = "roi.machine_load"        # other work on the machine as the sweep / the rung started
    # the sweep's outcome
    CHAMPION_RUN = "roi.champion_run"
    CHAMPION_RUNG = "roi.champion_rung"
    VERSUS_DEFAULTS = "roi.versus_defaults"  # the champion against the best engine started with its defaults
    PROMOTED_VERSION = "roi.promoted_version"
    INTERRUPTED = "roi.interrupted"
    RESUMED = "roi.resumed"
    SLOS_NOT_APPLICABLE = "roi.slos.not_applicable"
    ACCURACY_METRIC = "roi.accuracy_metric"  # the metric each lm-eval task is gated on, and who chose it
    DIAGNOSIS = "roi.diagnosis"
    DIAGNOSIS_MODEL_LAYER = "roi.diagnosis.model_layer"
    DIAGNOSIS_RESOURCE_LAYER = "roi.diagnosis.resource_layer"
    DIAGNOSIS_FRAMEWORK_PROFILE = "roi.diagnosis.framework_profile"
    RECOMMENDED_NEXT_RUNG = "roi.recommended_next_rung"
    RECOMMENDED_NEXT_RUNG_REASON = "roi.recommended_next_rung.reason"


class Metric:
    """Per-request latencies (ms) that the servers record, the levels summarise, SLOs and the gate judge."""
    E2E_MS = "e2e_ms"            # arrival to last token (an encoder: to the embedding)
    TTFT_MS = "ttft_ms"          # arrival to first token (decoders only)
    TPOT_MS = "tpot_ms"          # mean time per output token after the first
    ITL_MS = "itl_ms"            # gaps between consecutive tokens (RequestRecord.itl_ms)
    QUEUE_MS = "queue_ms"        # arrival to the engine's start on it
    MODEL_MS = "model_ms"        # engine compute
    BATCH_MS = "batch_ms"        # one batch's forward pass (batching encoders)
    SEND_LAG_MS = "send_lag_ms"  # the load generator's lateness against the schedule


# Every latency metric a gate objective or an SLO may name (the requests of a decoding model have them all).
LATENCY_METRICS = (Metric.E2E_MS, Metric.TTFT_MS, Metric.TPOT_MS, Metric.ITL_MS, Metric.QUEUE_MS, Metric.MODEL_MS)
# An encoder's request has one output (its embedding): TTFT, TPOT and ITL do not apply; batch_ms is the wall
# time of each batch (one sample per batch, not per request).
ENCODER_METRICS = (Metric.E2E_MS, Metric.QUEUE_MS, Metric.MODEL_MS, Metric.BATCH_MS)
# A table with no measured rung to say otherwise, and a run logged before target.kind was a param, are of this
# kind (experiments/targets/kinds).
DEFAULT_KIND = "causal-lm"
