"""The numbers arcpy shares with libarc/arc.h: ABI version, statuses, fault codes, limits, weight formats.

arc.h is their home; these copies exist so that the control logic runs where no libarc.so was
built. tests/test_abi.py parses arc.h and pins every value here equal to the header's.
"""

ABI_VERSION = 18

# arc_status
ARC_OK = 0
ARC_NOT_READY = 1
ARC_BUSY = 8

# arc_fault: what the commit kernel latches into the fault word
FAULT_NONE = 0
FAULT_TOKEN_RANGE = 1
FAULT_POSITION_RANGE = 2
FAULT_NONFINITE = 3
FAULT_DEGENERATE = 4
FAULT_MASK_TIMEOUT = 5
FAULT_NAMES = {
    FAULT_TOKEN_RANGE: "token out of range",
    FAULT_POSITION_RANGE: "position out of range",
    FAULT_NONFINITE: "non-finite logits",
    FAULT_DEGENERATE: "degenerate logits (every one equal)",
    FAULT_MASK_TIMEOUT: "no token mask from the host in time",
}

# The commit kernel compares each token against at most this many stop ids.
MAX_STOP_IDS = 8
MAX_LOGIT_BIAS = 256  # ARC_MAX_LOGIT_BIAS: the most (id, value) pairs of a request's logit bias
MAX_TOP_LOGPROBS = 20  # ARC_MAX_TOP_LOGPROBS: the most alternatives a token's log-probabilities list
MAX_WORLD = 8  # the most ranks a model splits over (tensor parallelism): the GPUs of one host
DRAFT_MEMORY = 16384  # ARC_DRAFT_MEMORY: the drafts' memory of earlier sequences holds fewer ids than this

# The device loop's ring (arc_loop_create's capacity) holds this many tokens, so a burst, whose
# tokens are all in flight at once, enqueues at most this many steps.
RING_CAPACITY = MAX_BURST = 1024

# arc_format: how a matrix tensor's weights are held (arc.h's "Weight formats")
FORMAT_BF16 = 0
FORMAT_Q8_0 = 1
FORMAT_Q4_0 = 2
FORMAT_Q4_1 = 3
FORMAT_Q4_K = 4
FORMAT_Q5_K = 5
FORMAT_Q6_K = 6
FORMAT_MXFP4 = 7
FORMAT_IQ4_NL = 8
FORMAT_IQ4_XS = 9
FORMAT_Q5_0 = 10
FORMAT_Q5_1 = 11
FORMAT_Q3_K = 12
FORMAT_Q2_K = 13
FORMAT_NAMES = {
    FORMAT_BF16: "bf16", FORMAT_Q8_0: "Q8_0", FORMAT_Q4_0: "Q4_0", FORMAT_Q4_1: "Q4_1",
    FORMAT_Q4_K: "Q4_K", FORMAT_Q5_K: "Q5_K", FORMAT_Q6_K: "Q6_K", FORMAT_MXFP4: "MXFP4",
    FORMAT_IQ4_NL: "IQ4_NL", FORMAT_IQ4_XS: "IQ4_XS", FORMAT_Q5_0: "Q5_0", FORMAT_Q5_1: "Q5_1",
    FORMAT_Q3_K: "Q3_K", FORMAT_Q2_K: "Q2_K",
}

# arc_layer_op: the ops of the layer program, in the order a Llama layer runs them (arc.h)
OP_ATTN_IN = 0
OP_QK_NORM = 1
OP_ATTEND = 2
OP_ATTN_OUT = 3
OP_FFN_IN = 4
OP_FFN_OUT = 5
OP_ATTN_OUT_NORM = 6
OP_FFN_OUT_NORM = 7
OP_MOE_IN = 8
OP_MOE_OUT = 9
OP_ATTN_GATE = 10
OP_DN_IN = 11
OP_DN_STEP = 12
OP_DN_OUT = 13
OP_LAYER_SCALAR = 14
OP_EXPERTS_BESIDE = 15
OP_PER_LAYER_INPUT = 16
OP_NAMES = {OP_ATTN_IN: "ATTN_IN", OP_QK_NORM: "QK_NORM", OP_ATTEND: "ATTEND", OP_ATTN_OUT: "ATTN_OUT",
            OP_FFN_IN: "FFN_IN", OP_FFN_OUT: "FFN_OUT", OP_ATTN_OUT_NORM: "ATTN_OUT_NORM",
            OP_FFN_OUT_NORM: "FFN_OUT_NORM", OP_MOE_IN: "MOE_IN", OP_MOE_OUT: "MOE_OUT", OP_ATTN_GATE: "ATTN_GATE",
            OP_DN_IN: "DN_IN", OP_DN_STEP: "DN_STEP", OP_DN_OUT: "DN_OUT",
            OP_LAYER_SCALAR: "LAYER_SCALAR", OP_EXPERTS_BESIDE: "EXPERTS_BESIDE",
            OP_PER_LAYER_INPUT: "PER_LAYER_INPUT"}
MAX_LAYER_OPS = 8

# arc_activation: the GLU's activation, by arcpy's name, in arc.h's order
ACTIVATIONS = ("silu", "gelu_tanh")
ACT_SWIGLU_LIMIT = 2  # gpt-oss's clamped GLU (a config's swiglu_limit, not its activation, selects it)

# arc_routing: an MoE layer's order of softmax and top-k, by arcpy's name, in arc.h's order
ROUTINGS = ("softmax_topk", "topk_softmax")

# The forms a KV cache may hold its rows in (arcpy/devices/kv_formats.py; libarc holds bf16 and q8_0).
KV_FORMATS = ("bf16", "q8_0", "fp8")
