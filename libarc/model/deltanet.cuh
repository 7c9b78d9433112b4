// deltanet.cuh -- the gated DeltaNet layer (arc.h: arc_model_config's dn_ fields, ARC_OP_DN_IN..
// ARC_OP_DN_OUT): which layers are DeltaNet layers, their tensors' shapes, their state's layout, and
// the launchers of its step (deltanet.cu) and of the attention's output gate (ARC_OP_ATTN_GATE).
//
// A DeltaNet layer's state lives in DN_SLOTS slots indexed by position: the step of the token at
// position p reads slot p % DN_SLOTS (zeros at p = 0) and writes slot (p + 1) % DN_SLOTS, never the
// one it read. A step run again at the same position (a burst's steps after its sequence ended)
// therefore writes the same state again, as a KV row is written again; the verify's rows at
// p..p + r - 1 each write their own slot, so the state after the accepted row is the one the next
// step reads. A slot holds the convolution's last dn_conv_kernel - 1 inputs, (conv channels,
// kernel - 1), oldest first, then S of each value head, (head_dim, head_dim) row by k.
#pragma once

#include "model/parts.cuh"

enum { DN_HEAD_DIM = 128, DN_MAX_KERNEL = 4, DN_SLOTS = 9 };

// Whether layer l is a DeltaNet layer; how many the config has, and how many come before l.
inline bool layer_dn(const arc_model_config &c, int l) {
    return l >= 0 && l < 128 && ((c.dn_layers[l / 32] >> (l % 32)) & 1u);
}
int dn_layer_count(const arc_model_config &c);
int dn_ordinal(const arc_model_config &c, int l);
// The checks arc_tensor_shape, arc_layer_program and arc_model_create make of the dn_ fields and
// attn_gate, as entry point `who` (ARC_OK when they hold).
int check_dn(const arc_model_config &c, const char *who);
// The table's rows and columns of a DeltaNet tensor (ARC_TENSOR_DN_*) in layer l, rows 0 where l is
// not a DeltaNet layer; any other tensor of a DeltaNet layer: the table's answer with the
// attention's tensors absent (`rows` as the caller computed them).
void dn_table_shape(const arc_model_config &c, int t, int l, uint64_t *rows, uint64_t *cols);
bool dn_replaces(int t);  // an attention tensor a DeltaNet layer does not have

// The sizes that follow from a config: see parts.cuh's DeltaNetDims.
DeltaNetDims dn_dims(const arc_model_config &c, int32_t q_dim, int32_t qkv_rows);

// The kernels that run the step (arc_ops.h: arc_op_deltanet_rows's form), each row getting the same
// bits from each (deltanet_math.cuh):
//   DN_HEAD_BLOCK  a block a value head, the rows one after another (deltanet.cu): the forwards'
//   DN_CLUSTER     four blocks a head in a cluster, 32 columns a block (deltanet_cluster.cu;
//                  compute capability 9.0 or more)
//   DN_ROWS        every row's inputs at once, then the rows through S by warps without a barrier,
//                  then every row's norm (deltanet_rows.cu; a scratch, DN_ROWS_MIN rows or more, one
//                  state kept, the position from the host)
// The forwards take DN_HEAD_BLOCK alone until the other two have passed their GPU tests
// (tests/test_gpu_deltanet.py compares the three).
enum DnForm { DN_HEAD_BLOCK = 0, DN_CLUSTER = 1, DN_ROWS = 2 };
enum { DN_ROWS_MIN = 16 };

// One launch of the DeltaNet step over `rows` consecutive tokens of one sequence (the decode: 1;
// the verify: its rows; the prefill: a chunk), each row r at position (pos ? *pos : 0) + pos_add + r.
struct DeltaNetIo {
    const float *u = nullptr;  // DN_IN's output rows, (rows, dims.rows) float32
    int32_t rows = 0;
    const int32_t *pos = nullptr;  // device memory, read on the device; or null
    int32_t pos_add = 0;
    bool every_state = false;  // write every row's state (the verify), else the last row's alone
    // *pos and the slot it reads are settled before the launch waits on the one before it (the
    // decode's step: earlier steps wrote them), so they are read before that wait, overlapping it.
    bool early = false;
    float *out = nullptr;      // att rows (rows, v_dim) float32; or
    uint16_t *out_bf16 = nullptr;  // the same in bf16 (the prefill's product input)
    DnForm form = DN_HEAD_BLOCK;
    float *scratch = nullptr;  // DN_ROWS: (rows, dims.scratch_row) floats
};
int deltanet_layer(arc_context *ctx, const arc_model_config &c, const DeltaNetDims &d, const LayerParts &lw,
                   const DeltaNetIo &io);
// DN_ROWS (deltanet_layer's checks made).
int deltanet_rows(arc_context *ctx, const arc_model_config &c, const DeltaNetDims &d, const LayerParts &lw,
                  const DeltaNetIo &io);

// att[r] *= sigmoid(gate[r]) for rows r, n elements each: gate rows `gate_stride` floats apart,
// att rows n apart, float32 or (att_bf16) bf16 rounded once after the product.
int launch_attn_gate(arc_context *ctx, float *att, uint16_t *att_bf16, const float *gate, int32_t gate_stride,
                     int32_t rows, int32_t n);
