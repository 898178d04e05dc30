<%namespace name="c" file="_common.mako"/>\
// ${prefix}: layout conversion ${src} -> ${dst} (${variant})
% if src_storage != storage:
//   and a cast of every element from ${c.T(src_storage)} to ${c.T()}
% endif
//   ${COUNT} floats; super dimensions N, C, S = H*W: ${A} = ${SA} (read along), ${B} = ${SB} (written along), ${R} = ${SR} (planes)
% if TILE:
// one work-group: a ${TILE}x${TILE} tile of the (${A}, ${B}) plane through local memory, ${ROWS} rows of work-items
% else:
// one work-item: one output element, in ${dst} order
% endif
#define WG ${WG}  // work-group size
#define TILE ${TILE}  // local tile side (0: none)
#define COUNT ${COUNT}
#define SA ${SA}
#define SB ${SB}
#define SR ${SR}

% if TILE:
#define ROWS ${ROWS}  // work-item rows per tile
__kernel __attribute__((reqd_work_group_size(TILE, ROWS, 1)))
void ${prefix}(__global const ${c.T(src_storage)}* restrict x, __global ${c.T()}* restrict y)
{
    __local float tile[TILE][TILE + 1];
    const int lx = get_local_id(0), ly = get_local_id(1);
    const int a0 = get_group_id(0) * TILE, b0 = get_group_id(1) * TILE;
    const int r = get_global_id(2);
    __global const ${c.T(src_storage)}* xr = x + r * ${SRC_R};
    __global ${c.T()}* yr = y + r * ${DST_R};
    for (int i = ly; i < TILE; i += ROWS) {
        const int a = a0 + lx, b = b0 + i;
        if (a < SA && b < SB)
            tile[i][lx] = ${c.LOAD("xr", "a * %d + b * %d" % (SRC_A, SRC_B), src_storage)};
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = ly; i < TILE; i += ROWS) {
        const int b = b0 + lx, a = a0 + i;
        if (a < SA && b < SB)
            ${c.STORE("yr", "a * %d + b * %d" % (DST_A, DST_B), "tile[lx][i]")};
    }
}
% else:
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void ${prefix}(__global const ${c.T(src_storage)}* restrict x, __global ${c.T()}* restrict y)
{
    const int gid = get_global_id(0);
    if (gid >= COUNT)
        return;
    // coordinates of output element gid in ${dst} order (${", ".join(DORDER)})
    const int ${DORDER[2].lower()} = gid % ${DIMS[DORDER[2]]};
    const int ${DORDER[1].lower()} = (gid / ${DIMS[DORDER[2]]}) % ${DIMS[DORDER[1]]};
    const int ${DORDER[0].lower()} = gid / ${DIMS[DORDER[2]] * DIMS[DORDER[1]]};
    ${c.STORE("y", "gid", capture(c.LOAD, "x", "n * %d + c * %d + s * %d" % (SRC_STRIDE["N"], SRC_STRIDE["C"], SRC_STRIDE["S"]), src_storage))};
}
% endif
