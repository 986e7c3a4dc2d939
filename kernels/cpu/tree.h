// Tree passes: several draft candidates verified in one pass. What a tree pass needs beyond a linear one: the
// tree's branches from its parents (`build_tree`), a branch's ancestors' rows gathered in stored form into a
// scratch cache (`gather_block`), and the row copies that move the accepted path's K/V into place afterwards
// (`copy_rows`, parley_kv_move in abi.h). attention_plan.h schedules the branches beside the linear rows.
//
// Node 0 of a tree pass sits at position `base`; every other node's parent is an earlier node and its position
// is its parent's + 1 (rotary and the attention range use it). Node m writes its K/V to slot base + m and
// attends, below `base`, the cache as is and, from `base` on, its ancestors. The nodes of the chain (node m at
// depth m, each the child of the one before it: what a linear pass holds) find their ancestors at slot ==
// position, so they read the cache exactly as a linear pass does. Every other node belongs to one branch (the
// path of a leaf, its nodes in index order = depth order); in each key block that holds an ancestor of the
// branch off the chain, the block's rows are gathered in stored form into a one-head scratch cache at the same
// offsets in the block and attended by the same code. Blocks stay blocks of positions, so a node's logits are
// bitwise those of the linear pass over its path.

#pragma once
#include "attention.h"

struct Tree {
    int base;             // position (and slot) of node 0
    const int* group;     // per node: -1 on the chain, else its branch
    int ngroups;
    const int* offsets;   // [ngroups + 1]: branch g's nodes are members[offsets[g] .. offsets[g + 1])
    const int* members;
    const int* fork;      // per branch: the first depth at which its leaf's path leaves the chain
    const int* path;      // [ngroups][stride]: the node at each depth of the branch's leaf path
    const int* depth;     // per branch: its leaf's depth
    int stride;
    char* scratch;        // per thread: scratch_bytes of gathered rows
    size_t scratch_bytes;
};

// Bytes of one row of each cache tensor (k, v, ks, vs, vm) in the stored form; 0: the kind has no such tensor.
static void row_bytes(int kind, int D, size_t* b) {
    const size_t e = kind == KV_F32 ? 4 : (kind == KV_BF16 ? 2 : 1);
    b[0] = D * e;
    b[1] = kind == KV_K8V4 ? D / 2 : D * e;
    b[2] = kind >= KV_INT8 ? 4 : 0;
    b[3] = kind == KV_INT8 ? 4 : (kind == KV_K8V4 ? (size_t)(D / 32) * 4 : 0);
    b[4] = kind == KV_K8V4 ? (size_t)(D / 32) * 4 : 0;
}

// n consecutive rows from row `src` of `from` to row `dst` of `to` (rows of one layout, all tensors).
static void copy_rows(int kind, int D, const KV* from, size_t src, const KV* to, size_t dst, int n) {
    size_t b[5];
    row_bytes(kind, D, b);
    const void* f[5] = {from->k, from->v, from->ks, from->vs, from->vm};
    void* t[5] = {to->k, to->v, to->ks, to->vs, to->vm};
    for (int i = 0; i < 5; i++)
        if (b[i]) std::memmove((char*)t[i] + dst * b[i], (const char*)f[i] + src * b[i], (size_t)n * b[i]);
}

// Scratch for one head's block of ATT_BLOCK rows of every tensor.
static size_t gather_bytes(int kind, int D) {
    size_t b[5], total = 0;
    row_bytes(kind, D, b);
    for (int i = 0; i < 5; i++) total += (b[i] * ATT_BLOCK + 63) / 64 * 64;
    return total;
}

// Rows [j0, j1) of block b of kv head h as branch g sees them, into the one-head cache `out` (max_len ATT_BLOCK,
// position j at row j - b * ATT_BLOCK) laid out in `mem`.
static void gather_block(const Cache* c, const KV* kv, int h, int D, const Tree* t, int g, int b, int j0, int j1,
                         char* mem, KV* out) {
    size_t rb[5];
    row_bytes(c->kind, D, rb);
    void** dst[5] = {&out->k, &out->v, (void**)&out->ks, (void**)&out->vs, (void**)&out->vm};
    for (int i = 0; i < 5; i++) {
        *dst[i] = rb[i] ? (void*)mem : nullptr;
        mem += (rb[i] * ATT_BLOCK + 63) / 64 * 64;
    }
    const size_t row0 = (size_t)h * c->max_len, shift = (size_t)b * ATT_BLOCK;
    const int fork = t->base + t->fork[g];  // positions from here on are the branch's own nodes
    if (j0 < fork) copy_rows(c->kind, D, kv, row0 + j0, out, j0 - shift, std::min(j1, fork) - j0);
    for (int j = std::max(j0, fork); j < j1; j++)
        copy_rows(c->kind, D, kv, row0 + t->base + t->path[(size_t)g * t->stride + j - t->base], out, j - shift, 1);
}

// The branches of a tree pass from its parents (parents[0] = -1, 0 <= parents[m] < m, positions[m] =
// positions[parents[m]] + 1), in `buf` (ints, sized by tree_ints). False when `parents` is not such a tree.
static size_t tree_ints(int M) { return (size_t)M * (M + 8) + 8; }

static bool build_tree(int M, const int64_t* positions, const int64_t* parents, int* buf, Tree* t) {
    if (M < 1 || parents[0] != -1) return false;
    int *depth = buf, *group = buf + M, *has_child = buf + 2 * M, *offsets = buf + 3 * M, *members = buf + 4 * M + 1;
    int *fork = buf + 5 * M + 1, *leaf_depth = buf + 6 * M + 1, *path = buf + 7 * M + 1;
    depth[0] = 0;
    for (int m = 0; m < M; m++) has_child[m] = 0, group[m] = -1;
    for (int m = 1; m < M; m++) {
        const int64_t pa = parents[m];
        if (pa < 0 || pa >= m || positions[m] != positions[pa] + 1) return false;
        depth[m] = depth[pa] + 1;
        has_child[pa] = 1;
    }
    for (int m = 1; m < M; m++)  // with parents before children, depth m means the path 0, 1, ..., m: the chain
        if (depth[m] != m) group[m] = -2;
    int ng = 0, nmem = 0;
    for (int leaf = 0; leaf < M; leaf++) {  // each off-chain leaf's path is a branch; a node joins the first
        if (has_child[leaf] || group[leaf] != -2) continue;
        int* pth = path + (size_t)ng * M;
        for (int m = leaf; m >= 0; m = (int)parents[m]) pth[depth[m]] = m;
        int d = 0;
        while (pth[d] == d) d++;
        fork[ng] = d, leaf_depth[ng] = depth[leaf], offsets[ng] = nmem;
        for (int k = d; k <= depth[leaf]; k++)
            if (group[pth[k]] == -2) group[pth[k]] = ng, members[nmem++] = pth[k];
        ng++;
    }
    offsets[ng] = nmem;
    for (int m = 0; m < M; m++) if (group[m] == -2) return false;
    t->base = (int)positions[0];
    t->group = group, t->ngroups = ng, t->offsets = offsets, t->members = members, t->fork = fork, t->path = path;
    t->depth = leaf_depth, t->stride = M;
    return true;
}

// Whether rows [0, M) of `parents` (indices within the segment) are a chain: each row follows the one before.
static bool is_chain(int M, const int64_t* parents) {
    for (int m = 0; m < M; m++)
        if (parents[m] != m - 1) return false;
    return true;
}
