<%
    nearest = mode == "nearest"
%>\
## src(name, m, what): the inline function giving output index o's source along one axis, from
## its exact coordinate n / D, n = A*o + B (m: variants/upsample.py's axis_map)
<%def name="src(name, m, what)">
<% T, D, IN, E = m["T"], m["D"], m["IN"], m["EXPR"] %>\
% if mode == "nearest":
// the input ${what} of output ${what} o: ${rounding}((${E}) / ${D}), clamped to [0, ${IN - 1}]
inline int ${name}(int o)
{
    const ${T} n = ${E};
% if rounding == "floor":
    const ${T} num = n, den = ${D};
% elif rounding == "ceil":
    const ${T} num = -n, den = ${D};         // ceil(n / D) = -floor(-n / D)
% elif rounding == "round_prefer_floor":
    const ${T} num = ${D} - 2 * n, den = 2 * (${T})${D};    // ceil(c - 1/2) = -floor((1/2 - c))
% else:
    const ${T} num = 2 * n + ${D}, den = 2 * (${T})${D};    // floor(c + 1/2)
% endif
    ${T} q = num >= 0 ? num / den : -((-num + den - 1) / den);    // floor(num / den)
% if rounding in ("ceil", "round_prefer_floor"):
    q = -q;
% endif
    return (int)min(max(q, (${T})0), (${T})${IN - 1});
}
% else:
// output ${what} o interpolates input ${what}s i and min(i + 1, ${IN - 1}) with weight *w on the
// second, at coordinate (${E}) / ${D} clamped to [0, ${IN - 1}]
inline int ${name}(int o, float* w)
{
    const ${T} n = ${E};
    if (n <= 0) {
        *w = 0.0f;
        return 0;
    }
    const ${T} i = n / ${D};
    if (i >= ${IN - 1}) {
        *w = 0.0f;
        return ${IN - 1};
    }
    *w = (float)(n - i * ${D}) / (float)${D};
    return (int)i;
}
% endif
</%def>\
// ${prefix}: upsample (${variant}): ${NC} planes of ${H}x${W} -> ${P}x${Q}, mode ${mode},
//   coordinates ${coordinates}${", rounding " + rounding if nearest else ""}
// one work-item: QB consecutive outputs of one output row
#define WG ${WG}  // work-group size
#define QB ${QB}  // outputs per work-item
#define NC ${NC}  // planes (N*C)
#define H ${H}
#define W ${W}
#define P ${P}  // output rows
#define Q ${Q}  // output columns
#define QBLOCKS ((Q + QB - 1) / QB)
${src("src_row", rows, "row")}\
${src("src_col", cols, "column")}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(__global const float* restrict x, __global float* restrict y)
{
    const int gid = get_global_id(0);
    if (gid >= NC * P * QBLOCKS)
        return;
    const int qb = gid % QBLOCKS;
    const int p = (gid / QBLOCKS) % P;
    const int plane = gid / (QBLOCKS * P);
    __global float* yr = y + (plane * P + p) * Q;
% if nearest:
    __global const float* xr = x + (plane * H + src_row(p)) * W;
    for (int r = 0; r < QB; ++r) {
        const int q = qb * QB + r;
        if (q >= Q)
            break;
        yr[q] = xr[src_col(q)];
    }
% else:
    float wy;
    const int r0 = src_row(p, &wy);
    __global const float* x0 = x + (plane * H + r0) * W;
    __global const float* x1 = x + (plane * H + min(r0 + 1, H - 1)) * W;
    for (int r = 0; r < QB; ++r) {
        const int q = qb * QB + r;
        if (q >= Q)
            break;
        float wx;
        const int c0 = src_col(q, &wx);
        const int c1 = min(c0 + 1, W - 1);
        const float top = x0[c0] + wx * (x0[c1] - x0[c0]);
        const float bottom = x1[c0] + wx * (x1[c1] - x1[c0]);
        yr[q] = top + wy * (bottom - top);
    }
% endif
}
