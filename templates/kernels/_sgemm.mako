## The tiled SGEMM core (aotconv/variants/gemm_tiles.py): C[m][n] = sum_k A[k][m] * B[k][n] over
## packed, zero-padded, k-major operands. Used by conv_im2col, conv_winograd and dense_gemm.
##
## defines():        the tunables and derived sizes, for the top of a kernel file.
## mainloop(A, B, LDA, LDB, KLEN):  inside a kernel body (at function scope: it declares the
##     __local tiles). A, B: expressions of type `const __global float*` pointing at element
##     [0][0] of this batch's packed operands; LDA, LDB: their row lengths (multiples of MWG/NWG);
##     KLEN: the padded reduction length (a multiple of KWG). Leaves `acc[MWI][NVI]` (realN) and
##     the macros ROW(i, v) (row of vector i, component v) and COL(j) (first column of vector j).
## store_packed(C, LDC): writes acc unguarded into a packed, padded C (partials, Winograd).
<%!
from aotconv.variants.kernel_text import comp
%>\
<%def name="defines()">
#define MWG ${MWG}        // tile rows (M) per work-group
#define NWG ${NWG}        // tile columns (N) per work-group
#define KWG ${KWG}        // K step held in local memory
#define MDIMC ${MDIMC}    // work-items along M
#define NDIMC ${NDIMC}    // work-items along N
#define VWM ${VWM}        // vector width along M (A loads, register block)
#define VWN ${VWN}        // vector width along N (B loads, register block, C stores)
#define PRE ${PRE}        // 1: prefetch the next K tile into registers during the multiply
#define MWI (MWG / MDIMC) // rows per work-item
#define NWI (NWG / NDIMC) // columns per work-item
#define MVI (MWI / VWM)   // row vectors per work-item
#define NVI (NWI / VWN)   // column vectors per work-item
#define THREADS (MDIMC * NDIMC)
#define ALOADS (KWG * MWG / VWM / THREADS) // A vectors each work-item loads per K step
#define BLOADS (KWG * NWG / VWN / THREADS) // B vectors each work-item loads per K step
typedef ${realM} realM;
typedef ${realN} realN;
</%def>

<%def name="load_tiles(k0, da, db, pad='')">\
${pad}    #pragma unroll
${pad}    for (int l = 0; l < ALOADS; ++l) {
${pad}        const int idx = tid + l * THREADS;
${pad}        ${da} = Ag[((${k0}) + idx / (MWG / VWM)) * (LDA_ / VWM) + idx % (MWG / VWM)];
${pad}    }
${pad}    #pragma unroll
${pad}    for (int l = 0; l < BLOADS; ++l) {
${pad}        const int idx = tid + l * THREADS;
${pad}        ${db} = Bg[((${k0}) + idx / (NWG / VWN)) * (LDB_ / VWN) + idx % (NWG / VWN)];
${pad}    }
</%def>

<%def name="mainloop(A, B, LDA, LDB, KLEN)">
    // ---- tiled SGEMM: acc = A^T B over this work-group's MWG x NWG tile of C ----
#define LDA_ (${LDA})
#define LDB_ (${LDB})
#define KLEN_ (${KLEN})
    const int tn = get_local_id(0);                  // work-item column in the tile
    const int tm = get_local_id(1);                  // work-item row in the tile
    const int tid = tm * NDIMC + tn;
    const int gm0 = get_group_id(1) * MWG;
    const int gn0 = get_group_id(0) * NWG;
    // Work-item (tm, tn) owns rows (i*MDIMC + tm)*VWM + v and columns (j*NDIMC + tn)*VWN + w:
    // strided, so neighbouring work-items read neighbouring local vectors (no bank conflicts)
    // and store neighbouring global vectors (coalesced).
#define ROW(i, v) (gm0 + ((i) * MDIMC + tm) * VWM + (v))
#define COL(j) (gn0 + ((j) * NDIMC + tn) * VWN)
    __local realM Als[KWG][MWG / VWM];
    __local realN Bls[KWG][NWG / VWN];
    const __global realM* Ag = (const __global realM*)(${A}) + gm0 / VWM;
    const __global realN* Bg = (const __global realN*)(${B}) + gn0 / VWN;
    realN acc[MWI][NVI];
    #pragma unroll
    for (int r = 0; r < MWI; ++r) {
        #pragma unroll
        for (int j = 0; j < NVI; ++j)
            acc[r][j] = (realN)(0.0f);
    }
% if PRE:
    realM pa[ALOADS];
    realN pb[BLOADS];
${load_tiles("0", "pa[l]", "pb[l]")}\
    for (int k0 = 0; k0 < KLEN_; k0 += KWG) {
        #pragma unroll
        for (int l = 0; l < ALOADS; ++l) {
            const int idx = tid + l * THREADS;
            Als[idx / (MWG / VWM)][idx % (MWG / VWM)] = pa[l];
        }
        #pragma unroll
        for (int l = 0; l < BLOADS; ++l) {
            const int idx = tid + l * THREADS;
            Bls[idx / (NWG / VWN)][idx % (NWG / VWN)] = pb[l];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (k0 + KWG < KLEN_) {                      // next tile in flight during the multiply
${load_tiles("k0 + KWG", "pa[l]", "pb[l]", pad="        ")}\
        }
% else:
    for (int k0 = 0; k0 < KLEN_; k0 += KWG) {
${load_tiles("k0", "Als[idx / (MWG / VWM)][idx % (MWG / VWM)]", "Bls[idx / (NWG / VWN)][idx % (NWG / VWN)]", pad="    ")}\
        barrier(CLK_LOCAL_MEM_FENCE);
% endif
        #pragma unroll
        for (int kk = 0; kk < KWG; ++kk) {
            realN b[NVI];
            #pragma unroll
            for (int j = 0; j < NVI; ++j)
                b[j] = Bls[kk][j * NDIMC + tn];
            #pragma unroll
            for (int i = 0; i < MVI; ++i) {
                const realM a = Als[kk][i * MDIMC + tm];
                #pragma unroll
                for (int j = 0; j < NVI; ++j) {
% for v in range(VWM):
                    acc[i * VWM + ${v}][j] = fma((realN)(a${comp(VWM, v)}), b[j], acc[i * VWM + ${v}][j]);
% endfor
                }
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#undef LDA_
#undef LDB_
#undef KLEN_
</%def>

<%def name="store_packed(C, LDC)">
    // ---- store the tile unguarded into a packed, padded C ----
    #pragma unroll
    for (int i = 0; i < MVI; ++i) {
        #pragma unroll
        for (int v = 0; v < VWM; ++v) {
            __global realN* crow = (__global realN*)((${C}) + ROW(i, v) * (${LDC}));
            #pragma unroll
            for (int j = 0; j < NVI; ++j)
                crow[COL(j) / VWN] = acc[i * VWM + v][j];
        }
    }
</%def>
