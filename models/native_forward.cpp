// The forward pass of a decoder model on the CPU, for any number of positions of any number of sequences at once:
// the description of a model's layers that models/native_step.py fills in (Layer, Model), `forward_pass` over
// them, its entry points (parley_forward, parley_forward_tree, parley_forward_batch) and the layout table of
// every struct the library takes. The layers are the pre-norm decoder blocks of the families Parley runs (llama,
// mistral, qwen2 with its q/k/v biases, qwen3 with its q/k norms, Gemma 3 with its sandwich norms, GeGLU, scaled
// embeddings and per-layer rotary tables and sliding windows); which parts a model has is in its Layer and Model.
//
// This file is the native library's one translation unit: it includes the kernels (kernels/cpu/*.h, the
// operations: products, row operations, attention, tree passes, their entry points), so the compiler sees every
// call of a pass and inlines across them as within one file. kernels/native.py builds it (the source path comes
// from models/native_forward.py), keyed by this file and every header it includes.
//
// Why one native step: a decode token of a 135M model is ~85 MB of weights, a few milliseconds at memory
// speed, while an eager PyTorch step spends about as long again on ~1,000 small op launches. Here a step is
// one call: INT4 weights times 8-bit activations with integer dot products, attention read straight from the
// cache in its stored form, and OpenMP threads across output columns / heads, one parallel region a pass.
//
// Batch invariance by construction: every per-position quantity (activation quantization, each output
// column's dot product, each head's attention row, each norm) is computed by the same sequence of operations
// whether the pass holds 1 position or 512, and whichever thread computes it. So a position's logits are bitwise
// the same in a decode pass, a verification pass, a tree pass, a prefill chunk or a pass shared with other
// sequences.
#include "../kernels/cpu/simd.h"
#include "../kernels/cpu/profile.h"
#include "../kernels/cpu/products.h"
#include "../kernels/cpu/rows.h"
#include "../kernels/cpu/attention.h"
#include "../kernels/cpu/tree.h"
#include "../kernels/cpu/attention_plan.h"
#include "../kernels/cpu/abi.h"

// What the pass reads of a model, filled in by models/native_step.py (mirrored in ctypes by
// models/native_forward.py): per layer its norms, its four products (kernels/cpu/products.h), its attention
// window and, where the family has them, the extra norms, rotary tables and the down projection's rotation.

struct Layer {
    const float* attn_norm;  // [dim]
    const float* ffn_norm;   // [dim]
    const float* q_norm;     // [head_dim] or null (qwen3)
    const float* k_norm;
    Lin qkv;                 // fused: N = (H + 2 KVH) * D
    Lin o;                   // N = dim
    Lin gate_up;             // fused and interleaved by 16 columns: gate[16], up[16], gate[16], ...
    Lin down;
    int32_t window;          // 0: global attention; else position p attends to keys j with p - window < j <= p
    // Gemma 3 (null / unused elsewhere):
    const float* post_attn_norm;  // [dim]: norms the attention output before the residual add
    const float* post_ffn_norm;   // [dim]: norms the MLP output before the residual add
    const float* rope_cos;        // [max_pos][head_dim/2]: this layer's own table (sliding layers), or null
    const float* rope_sin;
    // An online rotation of the down projection's input (models/quantize/hadamard.py), or null: each product
    // row times diag(down_diag), then the unnormalised Hadamard transform of each block of down_block.
    const float* down_diag;  // [inter]
    int32_t down_block;
};

struct Model {
    int32_t dim, n_layers, n_heads, n_kv_heads, head_dim, inter, vocab;
    float eps;
    const void* embed;       // [vocab][dim], as embed_dtype says
    const float* final_norm;
    const float* rope_cos;   // [max_pos][head_dim/2]
    const float* rope_sin;
    int32_t max_pos;
    Lin head;
    const Layer* layers;
    float embed_scale;       // embeddings times this (Gemma: sqrt(dim)); 0: not scaled
    float attn_scale;        // softmax scale of q.k; 0: 1/sqrt(head_dim)
    int32_t act;             // the MLP's gate activation: 0 SiLU (SwiGLU), 1 tanh-approximated GELU (GeGLU)
    int32_t embed_dtype;     // 0 fp32; 1 bf16, 2 fp16: a table held as stored, each looked-up row widened (exactly);
                             // 3: no table, `embed` is this pass's rows [M][dim] fp32 (a GGUF table's, decoded)
};

// One pass over the rows of `nseq` sequences: sequence s has rows[s] consecutive rows of `tokens` / `positions`,
// writes their K/V into caches[s] and attends only that cache. The products see all rows as one matrix (each row's
// arithmetic is its own: see the top of this file), so a row's logits are those of its sequence's pass alone.
// `parents` null: every sequence's pass is linear (slots = positions; position p attends slots 0..p, or its layer's
// window of them). Else, per row, the index within its sequence of the row it follows (-1 for the first): a
// sequence whose rows are not a chain is a tree pass (see Tree; node m writes slot positions[first] + m).
// logits [n_out][vocab] for rows out_rows[0..n_out) (ascending); out_rows null: the last n_out rows.
static int forward_pass(const Model* md, int nseq, const Cache* const* caches, const int* seq_rows,
                        const int64_t* tokens, const int64_t* positions, const int64_t* parents, int n_out,
                        const int* out_rows, float* logits) {
    const int dim = md->dim, H = md->n_heads, KVH = md->n_kv_heads, D = md->head_dim, I = md->inter;
    const int QKV = (H + 2 * KVH) * D;
    const int maxK = std::max(std::max(I, dim), H * D);
    if (g_threads > 0) omp_set_num_threads(g_threads);
    if (D > 512 || (H / KVH) > 8 || H % KVH) return -2;
    if (nseq < 1) return -4;
    int M = 0;
    for (int s = 0; s < nseq; s++) {
        if (seq_rows[s] < 1 || !caches[s]) return -4;
        M += seq_rows[s];
    }
    if (n_out < 0 || n_out > M) return -4;
    for (int i = 0; i < n_out; i++)
        if (out_rows && (out_rows[i] < 0 || out_rows[i] >= M || (i > 0 && out_rows[i] <= out_rows[i - 1]))) return -4;
    Seg* segs = (Seg*)scratch((size_t)nseq * sizeof(Seg));
    Tree* trees = (Tree*)scratch((size_t)nseq * sizeof(Tree));
    int** tree_bufs = (int**)std::calloc(nseq, sizeof(int*));
    int* seq_of = (int*)scratch((size_t)M * sizeof(int));
    size_t gather = 0;
    int rc = 0;
    for (int s = 0, m0 = 0; s < nseq; m0 += seq_rows[s++]) {
        const Cache* c = caches[s];
        const int n = seq_rows[s];
        int max_p = 0;
        for (int m = m0; m < m0 + n; m++) {
            if (positions[m] < 0 || positions[m] >= c->max_len || positions[m] >= md->max_pos) rc = -1;
            max_p = std::max(max_p, (int)positions[m]);
            seq_of[m] = s;
        }
        segs[s] = {c, m0, n, max_p / ATT_BLOCK + 1, nullptr, 0, 0, 0, 0};
        if (rc || !parents || is_chain(n, parents + m0)) continue;
        if (positions[m0] + n > c->max_len) {
            rc = -1;
            continue;
        }
        tree_bufs[s] = (int*)scratch(tree_ints(n) * sizeof(int));
        if (!build_tree(n, positions + m0, parents + m0, tree_bufs[s], &trees[s])) {
            rc = -3;
            continue;
        }
        segs[s].tree = &trees[s];
        gather = std::max(gather, gather_bytes(c->kind, D));
    }
    char* gather_scratch = gather ? (char*)scratch((size_t)omp_get_max_threads() * gather) : nullptr;
    for (int s = 0; s < nseq; s++)
        if (segs[s].tree) trees[s].scratch = gather_scratch, trees[s].scratch_bytes = gather;
    auto release = [&]() {
        for (int s = 0; s < nseq; s++) std::free(tree_bufs[s]);
        std::free(tree_bufs);
        std::free(trees);
        std::free(segs);
        std::free(seq_of);
        std::free(gather_scratch);
    };
    if (rc) {
        release();
        return rc;
    }
    float* x = (float*)scratch((size_t)M * dim * 4);
    float* xn = (float*)scratch((size_t)M * maxK * 4);
    float* qkv = (float*)scratch((size_t)M * QKV * 4);
    float* att = (float*)scratch((size_t)M * H * D * 4);
    float* gu = (float*)scratch((size_t)M * 2 * I * 4);
    float* tmp = (float*)scratch((size_t)M * dim * 4);
    Act a = new_act(M, maxK);
    const int nthreads = omp_get_max_threads();
    int nblk = 1;  // the partials' stride: the key blocks of the deepest sequence
    for (int s = 0; s < nseq; s++) nblk = std::max(nblk, segs[s].blocks);
    const int G = H / KVH, items = plan_attention(segs, nseq, KVH, nthreads);
    const size_t part_stride = (size_t)G * (D + 2);  // one block's partial for one kv head
    float* parts = (float*)scratch((size_t)M * KVH * nblk * part_stride * 4);
    float* att_scores = (float*)scratch((size_t)nthreads * ATT_SCORES * ATT_BLOCK * 4);
    const float scale = md->attn_scale > 0 ? md->attn_scale : 1.0f / std::sqrt((float)D);

    for (int m = 0; m < M; m++) {
        float* xm = x + (size_t)m * dim;
        if (md->embed_dtype == 0) {
            std::memcpy(xm, (const float*)md->embed + (size_t)tokens[m] * dim, dim * 4);
        } else if (md->embed_dtype == 3) {  // the pass's own rows, looked up by the caller
            std::memcpy(xm, (const float*)md->embed + (size_t)m * dim, dim * 4);
        } else {
            const uint16_t* e = (const uint16_t*)md->embed + (size_t)tokens[m] * dim;
            if (md->embed_dtype == 1)
                for (int i = 0; i < dim; i++) xm[i] = bf16_to_f32(e[i]);
            else
                for (int i = 0; i < dim; i++) xm[i] = half_to_f32(e[i]);
        }
        if (md->embed_scale != 0.0f)
            for (int i = 0; i < dim; i++) xm[i] *= md->embed_scale;
    }
    const int rows = n_out;
    auto out_row = [&](int i) { return out_rows ? out_rows[i] : M - n_out + i; };

    // One parallel region for the whole pass: each step below splits its rows / columns / heads over the
    // threads and ends at the barrier of its `omp for`.
#pragma omp parallel
    for (int l = 0; l < md->n_layers; l++) {
        if (l == 0) prof_start();
        // Rows normed together: up to 8 (rmsnorm_rows advances them side by side), but a short pass's rows split over
        // the threads (8 rows on one thread leave the others waiting at every norm's barrier); the same bits either way.
        const int nrn = std::min(8, std::max(1, (M + omp_get_num_threads() - 1) / omp_get_num_threads()));
        // A pass of fewer positions than threads (a decode step) splits each position's rotary and MLP activation
        // over the threads (by heads, by ranges of blocks), which else leave all but one thread at the barrier;
        // every value is computed as it is whole, so the bits are the same.
        const int nsplit = M < omp_get_num_threads() ? omp_get_num_threads() : 1;
        const Layer* L = md->layers + l;
#pragma omp for schedule(static) PARLEY_NOWAIT
        for (int m0 = 0; m0 < M; m0 += nrn) {  // (the previous layer's residual) + norm + activation quantization
            const int nr = std::min(nrn, M - m0);  // rows normed together (rmsnorm_rows)
            if (l > 0)
                for (int i = 0; i < nr * dim; i++) x[(size_t)m0 * dim + i] += tmp[(size_t)m0 * dim + i];
            rmsnorm_rows(x + (size_t)m0 * dim, L->attn_norm, xn + (size_t)m0 * dim, nr, dim, md->eps);
            if (quantized(&L->qkv))
                for (int m = m0; m < m0 + nr; m++) quantize_row(xn + (size_t)m * dim, dim, lin_block(&L->qkv), &a, m);
        }
        prof_phase(PH_NORM);
        linear(&L->qkv, M, xn, &a, qkv);
        prof_phase(PH_QKV);
#pragma omp for schedule(static) PARLEY_NOWAIT
        for (int u = 0; u < M * nsplit; u++) {  // q/k norm (qwen3), rotary, then the new K/V into the cache
            const int m = u / nsplit, g = u % nsplit;  // position m's heads, share g of nsplit (head by head)
            float* row = qkv + (size_t)m * QKV;
            const int p = (int)positions[m];
            const float* cs = (L->rope_cos ? L->rope_cos : md->rope_cos) + (size_t)p * (D / 2);
            const float* sn = (L->rope_sin ? L->rope_sin : md->rope_sin) + (size_t)p * (D / 2);
            const int q0 = H * g / nsplit, q1 = H * (g + 1) / nsplit;
            const int k0 = KVH * g / nsplit, k1 = KVH * (g + 1) / nsplit;
            for (int h = q0; h < q1; h++) {
                if (L->q_norm) rmsnorm_row(row + h * D, L->q_norm, row + h * D, D, md->eps);
                rope_row(row + h * D, D, cs, sn);
            }
            const Seg& sg = segs[seq_of[m]];
            const int slot = sg.tree ? sg.tree->base + (m - sg.m0) : p;
            for (int h = k0; h < k1; h++) {
                float* k = row + (H + h) * D;
                if (L->q_norm) rmsnorm_row(k, L->k_norm, k, D, md->eps);  // q and k norms come together
                rope_row(k, D, cs, sn);
                kv_write(sg.c, sg.c->layers + l, h, slot, D, k, row + (H + KVH + h) * D);
            }
        }
        prof_phase(PH_ROPE);
        attend_blocks(segs, nseq, items, l, positions, H, KVH, D, L->window, qkv, QKV, scale, nblk, parts, att_scores);
        prof_phase(PH_ATTEND);
#pragma omp for schedule(static) PARLEY_NOWAIT
        for (int m = 0; m < M; m++) {  // merge the blocks, then quantize for the output projection
            attend_merge(KVH, G, D, L->window, (int)positions[m], nblk, parts + (size_t)m * KVH * nblk * part_stride,
                         att + (size_t)m * H * D);
            if (quantized(&L->o)) quantize_row(att + (size_t)m * H * D, H * D, lin_block(&L->o), &a, m);
        }
        prof_phase(PH_MERGE);
        linear(&L->o, M, att, &a, tmp);
        prof_phase(PH_O);
#pragma omp for schedule(static) PARLEY_NOWAIT
        for (int m0 = 0; m0 < M; m0 += nrn) {
            const int nr = std::min(nrn, M - m0);
            float* t = tmp + (size_t)m0 * dim;
            if (L->post_attn_norm) rmsnorm_rows(t, L->post_attn_norm, t, nr, dim, md->eps);
            for (int i = 0; i < nr * dim; i++) x[(size_t)m0 * dim + i] += t[i];
            rmsnorm_rows(x + (size_t)m0 * dim, L->ffn_norm, xn + (size_t)m0 * dim, nr, dim, md->eps);
            if (quantized(&L->gate_up))
                for (int m = m0; m < m0 + nr; m++) quantize_row(xn + (size_t)m * dim, dim, lin_block(&L->gate_up), &a, m);
        }
        prof_phase(PH_NORM2);
        linear(&L->gate_up, M, xn, &a, gu);
        prof_phase(PH_GATE_UP);
        // SiLU(gate) * up (or GeGLU), undoing the 16-column interleave, the down projection's rotation, then
        // quantized: position m's row in nsplit ranges of whole units (Hadamard and activation blocks)
        const int unit = std::max(64, L->down_diag ? L->down_block : 64), units = I % unit ? 0 : I / unit;
        const int ns = units >= nsplit ? nsplit : 1;
#pragma omp for schedule(static) PARLEY_NOWAIT
        for (int u = 0; u < M * ns; u++) {
            const int m = u / ns, g = u % ns;
            const int j0 = ns > 1 ? units * g / ns * unit : 0, j1 = ns > 1 ? units * (g + 1) / ns * unit : I;
            const bool split = split_gate_up(&L->gate_up);
            float* h = xn + (size_t)m * I;
            if (md->act == 1) gelu_mul_row(gu + (size_t)m * 2 * I, I, h, split, j0, j1);
            else silu_mul_row(gu + (size_t)m * 2 * I, I, h, split, j0, j1);
            if (L->down_diag) hadamard_row(h + j0, j1 - j0, L->down_diag + j0, L->down_block);
            if (quantized(&L->down)) {
                const int bs = lin_block(&L->down);
                quantize_row(h, I, bs, &a, m, j0 / bs, j1 / bs);
            }
        }
        prof_phase(PH_SILU);
        linear(&L->down, M, xn, &a, tmp);
        prof_phase(PH_DOWN);
        if (L->post_ffn_norm) {
#pragma omp for schedule(static) PARLEY_NOWAIT
            for (int m0 = 0; m0 < M; m0 += nrn)
                rmsnorm_rows(tmp + (size_t)m0 * dim, L->post_ffn_norm, tmp + (size_t)m0 * dim, std::min(nrn, M - m0),
                             dim, md->eps);
            prof_phase(PH_POST);
        }
    }
    for (int i = 0; i < rows; i++) {  // only the rows whose logits are wanted go through the head
        const int m = out_row(i);
        float* xr = x + (size_t)m * dim;
        for (int j = 0; j < dim; j++) xr[j] += tmp[(size_t)m * dim + j];
        rmsnorm_row(xr, md->final_norm, xn + (size_t)i * dim, dim, md->eps);
    }
    if (rows > 0) {
#pragma omp parallel
        {
            prof_start();
            if (quantized(&md->head))
                quantize_acts(xn, rows, dim, lin_block(&md->head), &a);
            prof_phase(PH_HEAD_QUANT);
            linear(&md->head, rows, xn, &a, logits);
            prof_phase(PH_HEAD);
        }
    }
    std::free(x); std::free(xn); std::free(qkv); std::free(att); std::free(gu); std::free(tmp);
    free_act(&a);
    std::free(att_scores);
    std::free(parts);
    release();
    return 0;
}

// logits [M or 1][vocab] for one sequence's `tokens` at `positions`; writes their K/V into `cache` (slots =
// positions; position p attends slots 0..p, or its layer's window of them). `last_only`: the last row's only.
extern "C" int parley_forward(const Model* md, const Cache* cache, int M, const int64_t* tokens, const int64_t* positions,
                              int last_only, float* logits) {
    return forward_pass(md, 1, &cache, &M, tokens, positions, nullptr, last_only ? 1 : M, nullptr, logits);
}

// A tree pass (see Tree): -3 when `parents` is not a tree whose positions follow it.
extern "C" int parley_forward_tree(const Model* md, const Cache* cache, int M, const int64_t* tokens,
                                   const int64_t* positions, const int64_t* parents, int last_only, float* logits) {
    if (M < 1 || parents[0] != -1) return -3;
    return forward_pass(md, 1, &cache, &M, tokens, positions, parents, last_only ? 1 : M, nullptr, logits);
}

// Several sequences in one pass (see forward_pass): the engine's step. -1: a position outside a cache or the
// model; -3: a sequence's parents are not a tree its positions follow; -4: malformed rows or out_rows.
extern "C" int parley_forward_batch(const Model* md, int nseq, const Cache* const* caches, const int* seq_rows,
                                    const int64_t* tokens, const int64_t* positions, const int64_t* parents,
                                    int n_out, const int* out_rows, float* logits) {
    return forward_pass(md, nseq, caches, seq_rows, tokens, positions, parents, n_out, out_rows, logits);
}

// The layout table (kernels/cpu/abi.h): the kernels' structs, then the model's.
static const FieldLayout parley_layout_table[] = {
    PARLEY_KERNEL_LAYOUT,
    PARLEY_STRUCT(Layer), PARLEY_FIELD(Layer, attn_norm), PARLEY_FIELD(Layer, ffn_norm),
    PARLEY_FIELD(Layer, q_norm), PARLEY_FIELD(Layer, k_norm), PARLEY_FIELD(Layer, qkv), PARLEY_FIELD(Layer, o),
    PARLEY_FIELD(Layer, gate_up), PARLEY_FIELD(Layer, down), PARLEY_FIELD(Layer, window),
    PARLEY_FIELD(Layer, post_attn_norm), PARLEY_FIELD(Layer, post_ffn_norm), PARLEY_FIELD(Layer, rope_cos),
    PARLEY_FIELD(Layer, rope_sin), PARLEY_FIELD(Layer, down_diag), PARLEY_FIELD(Layer, down_block),
    PARLEY_STRUCT(Model), PARLEY_FIELD(Model, dim), PARLEY_FIELD(Model, n_layers), PARLEY_FIELD(Model, n_heads),
    PARLEY_FIELD(Model, n_kv_heads), PARLEY_FIELD(Model, head_dim), PARLEY_FIELD(Model, inter),
    PARLEY_FIELD(Model, vocab), PARLEY_FIELD(Model, eps), PARLEY_FIELD(Model, embed),
    PARLEY_FIELD(Model, final_norm), PARLEY_FIELD(Model, rope_cos), PARLEY_FIELD(Model, rope_sin),
    PARLEY_FIELD(Model, max_pos), PARLEY_FIELD(Model, head), PARLEY_FIELD(Model, layers),
    PARLEY_FIELD(Model, embed_scale), PARLEY_FIELD(Model, attn_scale), PARLEY_FIELD(Model, act),
    PARLEY_FIELD(Model, embed_dtype),
};

// Entry i of the table (0 past its end): struct name, field name ("" for the struct), offset, size.
extern "C" int parley_layout(int i, const char** type, const char** field, int* offset, int* size) {
    return layout_entry(parley_layout_table, i, type, field, offset, size);
}
