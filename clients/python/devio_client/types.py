"""types.py - the wire shapes of api/openapi.yaml as typed dictionaries.
Answers are the server's JSON as decoded; these types only name their keys for type checkers and readers."""
from typing import Dict, List, Literal, Optional, TypedDict, Union

TicketStatus = Literal["in_flight", "ok", "failed", "aborted", "reaped"]


class SampleParams(TypedDict, total=False):
    temperature: float  # below 1e-5 (0 included) is greedy
    top_k: int          # 0 is off
    top_p: float        # 1 is off
    min_p: float        # 0 is off
    seed: int
    logit_bias: Dict[str, Union[float, str]]  # token id -> bias; "-inf" bans
    allowed_tokens: str       # base64 of the vocabulary bitmask (32-bit little-endian words)
    banned_tokens: List[int]
    repetition_penalty: float  # 1 is off
    frequency_penalty: float   # 0 is off
    presence_penalty: float    # 0 is off
    penalty_from: int          # first position the penalties count
    logprobs: int              # top (id, logprob) pairs with each sampled token, 0 to 20


class TopLogprob(TypedDict):
    id: int
    logprob: float


class _RowRequired(TypedDict):
    seq: int
    tokens: List[int]


class Row(_RowRequired, total=False):
    logits: Literal["none", "last", "all"]
    adapter: Optional[str]
    sample: Optional[SampleParams]
    snapshot: Optional[Literal["end", "each"]]
    prompt_logprobs: bool   # answer each token's raw logprob given the ones before


class Plan(TypedDict):
    rows: List[Row]


class _RowResultRequired(TypedDict):
    seq: int
    len: int


class RowResult(_RowResultRequired, total=False):
    logits: int             # handle, when the row asked for logits
    tokens: List[int]       # the sampled token, when the row had `sample`
    logprobs: List[float]
    top_logprobs: List[List[TopLogprob]]  # when the sample asked for logprobs
    prompt_logprobs: List[Optional[float]]  # when the row asked: one per token, the first None


class Timing(TypedDict):
    queued_us: int
    compute_us: int


class StepResult(TypedDict):
    ticket: int
    rows: List[RowResult]
    timing: Timing
    tokens: int


class Sequence(TypedDict):
    seq: int
    len: int
    blocks: int
    busy: Optional[int]
    ssm_slot: bool
    snapshots_held: int
    snapshots: List[int]
    parked: bool


class Outcome(TypedDict, total=False):
    """One effect's answer; which keys are present depends on `kind`."""
    kind: str
    tokens: List[int]
    logprobs: List[float]
    top_logprobs: List[List[TopLogprob]]
    seq: int
    shared_blocks: int
    len: int
    freed_blocks: int
    freed_snapshots: int


class LogitsTop(TypedDict):
    shape: List[int]
    row: int
    top: List[List[Union[int, float]]]


class LogitsHandle(TypedDict):
    logits: int
    seq: int
    ticket: int
    rows: int
    position: int
    state: str  # "pending", "ready" or "failed"


class KvFacts(TypedDict):
    block_size: int
    blocks_total: int
    blocks_free: int
    blocks_shared: int


class SsmFacts(TypedDict):
    slots_total: int
    slots_used: int
    snapshots_total: int
    snapshots_used: int


class ParkedFacts(TypedDict):
    seqs: int
    bytes: int


class Facts(TypedDict):
    kv: KvFacts
    ssm: SsmFacts
    parked: ParkedFacts
    tickets_in_flight: int
    logits_live: int
    logits_rows_live: int
    adapters_loaded: int
    epoch: int


class Device(TypedDict):
    version: str
    backend: str
    numerics: Literal["strict", "fast"]
    device: dict
    model: dict
    max_depth: int
    limits: dict
    threads: int
    epoch: int


class Model(TypedDict):
    """GET /v1/model: what a client needs to tokenize, template and stop."""
    format: Literal["safetensors", "gguf"]
    architecture: str
    weight_types: List[str]
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied_embeddings: bool
    context_length: int
    bos_token_id: Optional[int]
    eos_token_id: Optional[int]
    pad_token_id: Optional[int]
    chat_template: Optional[str]
    limits: dict


class TicketError(TypedDict):
    code: str
    message: str


class TicketRecord(TypedDict):
    id: int
    epoch: int
    status: TicketStatus
    launched_ms: int
    settled_ms: Optional[int]
    rows: int
    tokens: int
    seqs: List[int]
    queued_us: Optional[int]
    compute_us: Optional[int]
    error: Optional[TicketError]
    request_id: Optional[str]
    answer: Optional["StepResult"]  # GET /v1/tickets/{id} only


class TicketHistory(TypedDict):
    tickets: List[TicketRecord]
    next: Optional[int]


class AdapterRecord(TypedDict):
    name: str
    path: str
    rank: int
    alpha: float
    scale: float
    targets: List[str]
    sha256: Optional[str]
    size: int
    state: Literal["loaded", "unloaded", "stale", "failed"]
    pinned: bool
    rows_served: int
    loaded_ms: int
    last_used_ms: int
    reason: Optional[str]


class Teardown(TypedDict):
    torn_down: bool
    aborted: int
