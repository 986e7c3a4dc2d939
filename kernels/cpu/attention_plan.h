// One layer's attention for every row of a pass, the forward pass's and parley_attention's: the work items
// (sequence, kv head, key block, and a group of positions in turn or one tree branch) planned over every
// sequence of the pass, and `attend_blocks`, which runs them inside the caller's parallel region and leaves each
// position's block partials for `attend_merge` (attention.h). A partial depends only on its position and its
// sequence's cache (and, in a tree, the path to it), never on the pass or the other sequences.

#pragma once
#include "attention.h"
#include "profile.h"
#include "tree.h"

// One sequence's rows of a pass: rows [m0, m0 + M), written to and attending its own cache `c`, whose positions
// reach `blocks` key blocks; `tree`: null for a linear pass. The rest is attend_blocks' plan (plan_attention).
struct Seg {
    const Cache* c;
    int m0, M, blocks;
    const Tree* tree;
    int gs, mgroups, ngroups, first;  // positions per group, groups of positions in turn, all groups, first item
};

// Work items of a pass are (sequence, kv head, key block, up to 32 of its positions in turn, or one branch of a
// tree), so a block is read once for those positions; a short pass with few items for the threads (an 8-token
// pass at depth 0: 3 kv heads x 1 block) splits its positions into smaller groups, so that no thread waits at the
// end for the other's second item. Returns the number of items; each segment's `first` is its first.
static int plan_attention(Seg* segs, int nseg, int KVH, int nt) {
    int blocks = 0, items = 0;
    for (int s = 0; s < nseg; s++) blocks += KVH * segs[s].blocks;
    const int split = blocks >= 2 * nt ? 1 : (2 * nt + blocks - 1) / blocks;  // groups wanted
    for (int s = 0; s < nseg; s++) {
        Seg& g = segs[s];
        g.gs = std::min(32, std::max((g.M + split - 1) / split, 1));
        g.mgroups = (g.M + g.gs - 1) / g.gs;
        g.ngroups = g.mgroups + (g.tree ? g.tree->ngroups : 0);
        g.first = items;
        items += KVH * g.blocks * g.ngroups;
    }
    return items;
}

// Every (kv head, key block, position) partial of a pass: parts [M][KVH][nblk][G][D + 2], slot b of position m
// holding keys [max(b * ATT_BLOCK, first key), min((b + 1) * ATT_BLOCK, p + 1)) of its sequence's cache, layer
// `layer`. A partial depends only on its position and its sequence's cache (and, in a tree, the path to it),
// never on the pass, the other sequences or its group. Queries: head i of position m at q + m * ldq + i * D.
// Inside a parallel region.
static void attend_blocks(const Seg* segs, int nseg, int items, int layer, const int64_t* positions, int H, int KVH,
                          int D, int window, const float* q, int ldq, float scale, int nblk, float* parts,
                          float* scores) {
    const int G = H / KVH;
    const size_t row_parts = (size_t)KVH * nblk * G * (D + 2);  // one position's partials
#pragma omp for schedule(dynamic, 1) PARLEY_NOWAIT
    for (int t = 0; t < items; t++) {
        int si = 0;
        while (si + 1 < nseg && segs[si + 1].first <= t) si++;
        const Seg& sg = segs[si];
        const Cache* c = sg.c;
        const KV* kv = c->layers + layer;
        const Tree* tree = sg.tree;
        const int M = sg.M, gs = sg.gs, mgroups = sg.mgroups, ngroups = sg.ngroups, u = t - sg.first;
        const int h = u / (sg.blocks * ngroups), b = u / ngroups % sg.blocks, g = u % ngroups;
        const int64_t* pos = positions + sg.m0;
        const float* qs = q + (size_t)sg.m0 * ldq;
        float* ps = parts + (size_t)sg.m0 * row_parts;
        float* s = scores + (size_t)omp_get_thread_num() * ATT_SCORES * ATT_BLOCK;
        int ms[32], nm = 0;
        if (g < mgroups) {  // positions in turn (a tree's chain nodes)
            for (int m = g * gs; m < std::min(M, g * gs + gs); m++)
                if (!tree || tree->group[m] < 0) ms[nm++] = m;
            attend_nodes(c, kv, h, 0, h, b, ms, nm, pos, KVH, D, G, window, qs, ldq, scale, nblk, ps, s);
            continue;
        }
        const int br = g - mgroups, *mem = tree->members + tree->offsets[br];
        const int n = tree->offsets[br + 1] - tree->offsets[br];
        const int leaf_p = tree->base + tree->depth[br], fork = tree->base + tree->fork[br];
        const int j0 = std::max(b * ATT_BLOCK, first_key((int)pos[mem[0]], window));
        const int j1 = std::min(leaf_p + 1, (b + 1) * ATT_BLOCK);
        if (j1 <= j0) continue;
        if (j1 <= fork) {  // this block holds none of the branch's own nodes: the cache as is
            attend_nodes(c, kv, h, 0, h, b, mem, n, pos, KVH, D, G, window, qs, ldq, scale, nblk, ps, s);
            continue;
        }
        Cache view = {c->kind, ATT_BLOCK, nullptr};
        KV rows;
        gather_block(c, kv, h, D, tree, br, b, j0, j1, tree->scratch + (size_t)omp_get_thread_num() * tree->scratch_bytes,
                     &rows);
        attend_nodes(&view, &rows, 0, b * ATT_BLOCK, h, b, mem, n, pos, KVH, D, G, window, qs, ldq, scale, nblk,
                     ps, s);
    }
}
