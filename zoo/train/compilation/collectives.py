"""The collectives of a compiled program, read from its HLO text (`compiled.as_text()`).

After XLA's SPMD partitioner has run, every byte a sharded step sends between devices is an
instruction of the per-device program: all-reduce, all-gather, reduce-scatter, all-to-all or
collective-permute (on TPU and GPU often split into an async `-start` / `-done` pair; the
`-start` is counted). Each instruction lives in a computation; a computation that is the body
of a `while` runs once per iteration, so a collective there runs trip-count times per step.
This module finds every collective, its per-device bytes, its replica groups, the loops around
it (their op names and trip counts) and the op it came from (`metadata={op_name=...}`), so a
test can hold a layout to what first principles say it must communicate, and the compile
command can print it.

XLA:CPU (fake devices) and the TPU compiler both print this form; they differ in what they
do after partitioning (the TPU compiler fuses, makes collectives async, may combine several
small all-reduces into one tuple-shaped one), which changes counts but not bytes.

Across slices (TPU Multislice), given the slice of each of the program's devices: a program
of every slice's devices (XLA:CPU's) names devices in replica groups by their place in the
device assignment (the mesh's devices in order), so each group's slices are looked up. The
TPU compiler instead compiles one slice's program (num_partitions = its devices, groups
local to the slice) and hands what crosses slices to the DCN runtime as host-transfer
`send`s tagged `_xla_megascale_transfer_type` (ALL_REDUCE, ALL_GATHER, ...): one device's
share of a collective between slices, usually the piece of an all-reduce left after a
reduce-scatter within the slice (a hierarchical all-reduce).
"""

import dataclasses
import math
import re

import numpy as np

# Element sizes of the HLO primitive types a train step uses (pred is stored as a byte).
_DTYPE_BYTES = {
    "pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
    "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
    "f8e4m3fn": 1, "f8e5m2": 1, "s4": 0.5, "u4": 0.5,
}
KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*?)\s+([a-z][\w\-]*)\((.*)$")
_ARRAY = re.compile(r"\b([a-z]\w*)\[([\d,]*)\]")
_CALLEES = re.compile(
    r"\b(?:body|condition|calls|to_apply|true_computation|false_computation)=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_MEGASCALE_TYPE = re.compile(r'_xla_megascale_transfer_type="(\w+)"')
_MEGASCALE_TARGET = re.compile(r'_xla_megascale_target=("[^"]*"|\{\{[\d,]*\}(?:,\{[\d,]*\})*\})')
# The DCN runtime's transfer types as collective kinds; ONE_TO_ONE and anything else is a
# point-to-point send of its buffer.
_MEGASCALE_KINDS = {"ALL_REDUCE": "all-reduce", "ALL_GATHER": "all-gather",
                    "REDUCE_SCATTER": "reduce-scatter", "ALL_TO_ALL": "all-to-all"}


@dataclasses.dataclass(frozen=True)
class Loop:
    """A `while` around a collective: where it came from and how often its body runs."""

    op_name: str
    trip_count: int | None  # None: XLA could not prove a constant trip count

    @property
    def made_by_compiler(self) -> bool:
        """A loop XLA made out of one op, not one of the program's (a scan or fori_loop traces
        to an op named '.../while'): e.g. the TPU compiler's windowed einsum, which splits an
        FSDP matmul's all-gather into steps of collective-permutes overlapped with the
        matmul's pieces, named after that dot_general."""
        return not self.op_name.endswith("while")


@dataclasses.dataclass(frozen=True)
class Collective:
    kind: str  # one of KINDS
    dtype: str  # of the (first) array it moves, e.g. 'bf16'
    shapes: tuple[tuple[int, ...], ...]  # its result arrays, per device
    bytes: int  # the whole array(s) it reduces or assembles, per device (see array_bytes)
    group_size: int  # devices in each replica group
    replica_groups: str  # as printed
    op_name: str  # the JAX op it came from ('' when XLA made it, e.g. a combined all-reduce)
    loops: tuple[Loop, ...]  # the while loops around it, outermost first
    name: str  # the HLO instruction
    slices: int = 1  # slices one of its groups spans (> 1: it crosses the DCN)
    dcn_transfer: bool = False  # the TPU compiler's cross-slice send (group_size = slices)

    @property
    def crosses_slices(self) -> bool:
        return self.slices > 1

    @property
    def dcn_bytes(self) -> float:
        """Bytes each device sends to other slices per execution, with the hierarchical
        algorithm (the TPU compiler's: within each slice a group's m devices split the array
        S over ICI, and each sends its 1/m over the DCN in a ring over the s slices):
        all-reduce 2 (s-1)/s S/m, all-gather and reduce-scatter (s-1)/s S/m; all-to-all
        (s-1)/s of its buffer; a permute its buffer (a bound when only some pairs cross). A
        DCN transfer is one device's share already (m = 1)."""
        s = self.slices
        if s <= 1:
            return 0.0
        if self.kind == "collective-permute":
            return float(self.bytes)
        if self.kind == "all-to-all":
            return (s - 1) / s * self.bytes
        per_slice = max(self.group_size // s, 1)
        factor = 2.0 if self.kind == "all-reduce" else 1.0
        return factor * (s - 1) / s * self.bytes / per_slice

    @property
    def executions(self) -> int | None:
        """Times it runs per program execution: the product of its loops' trip counts."""
        counts = [loop.trip_count for loop in self.loops]
        return None if None in counts else math.prod(counts)

    @property
    def wire_bytes(self) -> float:
        """Bytes each device sends per execution with the bandwidth-optimal ring algorithm:
        all-reduce 2 (n-1)/n S, all-gather and reduce-scatter (n-1)/n S of the whole array S,
        all-to-all (n-1)/n S, a permute S."""
        n = self.group_size
        if self.kind == "collective-permute":
            return float(self.bytes)
        factor = 2.0 if self.kind == "all-reduce" else 1.0
        return factor * (n - 1) / n * self.bytes if n > 1 else 0.0

    def inside(self, scope: str) -> bool:
        """Whether one of the program's loops around it comes from an op whose name contains
        `scope` (e.g. the 'attention' module's own block loops, as opposed to the layer scan
        that holds them; loops the compiler made out of one matmul do not count)."""
        return any(scope in loop.op_name for loop in self.loops if not loop.made_by_compiler)


def _array_shapes(type_text: str) -> list[tuple[str, tuple[int, ...]]]:
    # 'bf16[128,128]{1,0:T(8,128)(2,1)}' or '(f32[8]{0}, s32[])' -> [(dtype, dims), ...]
    return [(dtype, tuple(int(d) for d in dims.split(",") if d))
            for dtype, dims in _ARRAY.findall(type_text) if dtype in _DTYPE_BYTES]


# Replica groups in mesh form: the mesh's axes, optionally its device ids (iota form or a
# list; iota over the mesh when absent), then the axes each group spans, e.g.
# "mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_0'}".
_MESH_GROUPS = (r"mesh\[([^\]]*)\](?:,\s*device_ids=\((\[[\d,]+\](?:T\([\d,]+\))?|[\d,]+)\))?"
                r"\s*\{([^}]*)\}")


def _group_size(line: str) -> tuple[int, str]:
    match = re.search(rf"replica_groups=({_MESH_GROUPS}|\[[\d,]+\]<=\[[\d,]+\]"
                      r"(?:T\([\d,]+\))?|\{(?:\{[\d,]*\},?)*\})", line)
    if match is None:
        # collective-permute has source_target_pairs instead: a pair of devices.
        return 2, ""
    text = match.group(1)
    if text.startswith("mesh["):
        sizes = dict(re.findall(r"'(\w+)'=(\d+)", match.group(2)))
        axes = re.findall(r"'(\w+)'", match.group(4))
        return math.prod(int(sizes[a]) for a in axes), text
    if text.startswith("["):  # iota form [groups, size]<=[devices]
        return int(text[1:].split("]")[0].split(",")[-1]), text
    first = re.search(r"\{([\d,]*)\}", text[1:])
    return (len([x for x in first.group(1).split(",") if x]) if first else 1), text


def _iota(shape: list[int], dims: list[int], perm) -> np.ndarray:
    ids = np.arange(math.prod(dims)).reshape(dims)
    return (ids.transpose(perm) if perm else ids).reshape(shape)


def _groups(text: str) -> list[list[int]]:
    """The device ids of each replica group as printed: explicit ('{{0,1},{2,3}}' or a
    permute's source_target_pairs), iota form ('[2,4]<=[4,2]T(1,0)': iota over the dims,
    transposed, rows of the first shape) or mesh form (_MESH_GROUPS: one group per position
    on the axes not listed)."""
    iota = re.fullmatch(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", text)
    if iota:
        shape, dims = ([int(x) for x in g.split(",")] for g in iota.groups()[:2])
        perm = [int(x) for x in iota.group(3).split(",")] if iota.group(3) else None
        return _iota([shape[0], -1], dims, perm).tolist()
    mesh = re.fullmatch(_MESH_GROUPS, text)
    # (sub-axes, 'x':(1)2, are not read)
    if mesh and ":" not in mesh.group(3):
        axes = re.findall(r"'(\w+)'=(\d+)", mesh.group(1))
        names, sizes = [a for a, _ in axes], [int(n) for _, n in axes]
        ids = mesh.group(2) or f"[{math.prod(sizes)}]"
        listed = re.fullmatch(r"\[([\d,]+)\](?:T\(([\d,]+)\))?", ids)
        if listed:
            dims = [int(x) for x in listed.group(1).split(",")]
            perm = [int(x) for x in listed.group(2).split(",")] if listed.group(2) else None
            devices = _iota(sizes, dims, perm)
        else:
            devices = np.array([int(x) for x in ids.split(",")]).reshape(sizes)
        grouped = [names.index(a) for a in re.findall(r"'(\w+)'", mesh.group(3))]
        order = [i for i in range(len(names)) if i not in grouped] + grouped
        size = math.prod(sizes[i] for i in grouped)
        return devices.transpose(order).reshape(-1, size).tolist()
    if text.startswith("{"):
        return [[int(x) for x in group.split(",") if x]
                for group in re.findall(r"\{([\d,]*)\}", text[1:-1])]
    raise ValueError(f"collectives: replica groups {text!r} are in a form whose devices this "
                     "reader does not expand, so it cannot say which slices they span")


def _slices_spanned(line: str, groups: str, slice_of) -> int:
    if not groups:  # collective-permute: every (source, target) pair is a group of two
        pairs = re.search(r"source_target_pairs=(\{(?:\{[\d,]*\},?)*\})", line)
        groups = pairs.group(1) if pairs else ""
    return max((len({slice_of[i] for i in group}) for group in _groups(groups) if group),
               default=1) if groups else 1


def _devices_in_program(hlo_text: str) -> int:
    header = hlo_text.split("\n", 1)[0]
    counts = [re.search(rf"\b{key}=(\d+)", header) for key in ("num_partitions", "replica_count")]
    return math.prod(int(c.group(1)) for c in counts if c)


def _source_op(line: str, by_name: dict[str, str], hops: int = 3) -> str:
    """The op a DCN send's buffer comes from: the TPU compiler's sends carry no metadata, so
    the nearest producer within `hops` that does (e.g. the reduce-scatter of a gradient, named
    after its dot_general's transpose) names it; '' if none does."""
    frontier = [line]
    for _ in range(hops + 1):
        following = []
        for text in frontier:
            op_name = _OP_NAME.search(text)
            if op_name and text is not line:
                return op_name.group(1)
            instruction = _INSTRUCTION.match(text)
            operands = instruction.group(4).split(")", 1)[0] if instruction else ""
            following += [by_name[o] for o in re.findall(r"%([\w.\-]+)", operands)
                          if o in by_name]
        frontier = following
    return ""


def _dcn_transfer(line: str, name: str, type_text: str, op_name: str, loops,
                  num_slices: int | None) -> Collective:
    """A `send` the TPU compiler hands to the DCN runtime, as the collective it is a share of."""
    transfer = _MEGASCALE_TYPE.search(line).group(1)
    kind = _MEGASCALE_KINDS.get(transfer, "collective-permute")
    target = _MEGASCALE_TARGET.search(line)
    target_text = target.group(1).strip('"') if target else ""
    # '{1,2}x{0:3}': slices 1 and 2, each device with its peer in the other; or every
    # device id of the group ('{{100000,...}}', an all-to-all over all slices' devices).
    listed = re.match(r"\{([\d,]+)\}x", target_text)
    slices = len(listed.group(1).split(",")) if listed else (num_slices or 2)
    ids = re.fullmatch(r"\{\{([\d,]*)\}\}", target_text)
    size = len(ids.group(1).split(",")) if ids else slices
    arrays = _array_shapes(type_text)[:1]  # (buffer, u32 context, token)
    buffer = int(sum(math.prod(dims) * _DTYPE_BYTES[dtype] for dtype, dims in arrays))
    # The send holds the device's own piece of an all-gather (the whole is `slices` pieces)
    # and the whole array of the other kinds.
    whole = buffer * slices if kind == "all-gather" else buffer
    return Collective(kind=kind, dtype=arrays[0][0] if arrays else "",
                      shapes=tuple(dims for _, dims in arrays), bytes=whole, group_size=size,
                      replica_groups=f"DCN {transfer} {target_text}", op_name=op_name,
                      loops=loops, name=name, slices=slices, dcn_transfer=True)


def _trip_count(while_line: str, computations: dict[str, list[str]]) -> int | None:
    """A while loop's trip count: XLA:CPU prints it (`known_trip_count`); the TPU compiler does
    not, so it is read off the loop's condition when that is `counter < constant` (how jax
    lowers a scan: a counter from 0 in steps of 1). None when neither says."""
    known = _TRIP_COUNT.search(while_line)
    if known:
        return int(known.group(1))
    condition = re.search(r"\bcondition=%([\w.\-]+)", while_line)
    lines = computations.get(condition.group(1), []) if condition else []
    bounds = [int(m.group(1)) for text in lines
              for m in [re.search(r"= [su]32\[\][^ ]* constant\((\d+)\)", text)] if m]
    root = next((text for text in lines if text.lstrip().startswith("ROOT")), "")
    if len(bounds) == 1 and " compare(" in root and "direction=LT" in root:
        return bounds[0]
    return None


def array_bytes(kind: str, result_bytes: int, group_size: int, fused: bool = False) -> int:
    """The whole array a collective reduces or assembles, from its per-device result: an
    all-gather's result is it; a reduce-scatter's result is one of group_size pieces of it
    (unless it is the TPU's fused all-reduce, whose result is still the whole)."""
    return result_bytes * group_size if kind == "reduce-scatter" and not fused else result_bytes


def collectives(hlo_text: str, slice_of=None) -> list[Collective]:
    """Every collective of the per-device program `hlo_text`, with the loops around it.

    `slice_of[i]` is the slice of the program's device i (the compiled function's devices in
    their order: a mesh's `devices.flat`); with it, each collective says how many slices its
    groups span (`slices`), and the TPU compiler's cross-slice sends are collectives too.
    """
    computations: dict[str, list[str]] = {}
    entry, current = None, None
    for line in hlo_text.splitlines():
        match = _COMPUTATION.match(line)
        if match:
            current = match.group(1)
            computations[current] = []
            if line.startswith("ENTRY"):
                entry = current
        elif current is not None and line.strip() and line.strip() != "}":
            computations[current].append(line)
    if entry is None:
        raise ValueError("collectives: no ENTRY computation in the HLO text (give "
                         "compiled.as_text() of a jitted, compiled function)")

    # The loops around each computation, found by walking the call graph from ENTRY.
    loops_of: dict[str, tuple[Loop, ...]] = {entry: ()}
    pending = [entry]
    while pending:
        caller = pending.pop()
        for line in computations.get(caller, ()):
            callees = _CALLEES.findall(line)
            for branches in _BRANCHES.findall(line):
                callees += re.findall(r"%([\w.\-]+)", branches)
            if not callees:
                continue
            instruction = _INSTRUCTION.match(line)
            is_while = instruction is not None and instruction.group(3) == "while"
            loop = None
            if is_while:
                op_name = _OP_NAME.search(line)
                loop = Loop(op_name.group(1) if op_name else "", _trip_count(line, computations))
            for callee in callees:
                around = loops_of[caller] + ((loop,) if loop is not None else ())
                # A computation reached twice keeps the deeper nest (the costlier reading).
                if callee not in loops_of or len(around) > len(loops_of[callee]):
                    loops_of[callee] = around
                    pending.append(callee)

    # Groups name the program's devices: all slices' when it holds them all (XLA:CPU); one
    # slice's when the TPU compiler made a program per slice (then no group crosses).
    num_slices = len(set(slice_of)) if slice_of is not None else None
    whole_program = bool(num_slices and num_slices > 1
                         and _devices_in_program(hlo_text) == len(slice_of))
    found, producers = [], {}
    for computation, lines in computations.items():
        if computation not in loops_of:
            continue  # not reachable from ENTRY (XLA keeps some dead clones)
        for line in lines:
            instruction = _INSTRUCTION.match(line)
            if instruction is None:
                continue
            name, type_text, opcode, _ = instruction.groups()
            if opcode == "send" and "_xla_megascale_transfer_type" in line:
                if computation not in producers:  # instruction name -> line, once
                    producers[computation] = {m.group(1): text for text in lines
                                              for m in [_INSTRUCTION.match(text)] if m}
                found.append(_dcn_transfer(line, name, type_text,
                                           _source_op(line, producers[computation]),
                                           loops_of[computation], num_slices))
                continue
            kind = opcode[:-len("-start")] if opcode.endswith("-start") else opcode
            if kind not in KINDS:
                continue
            if kind == "all-reduce" and computation.startswith("all-reduce-scatter"):
                # The TPU compiler's reduce-scatter: an all-reduce fused with the slice each
                # device keeps (its fusion's outputs are the slices), sent as one.
                kind = "reduce-scatter"
            arrays = _array_shapes(type_text)
            if opcode.endswith("-start") and len(arrays) > 1:
                # An async start's result holds its operands beside its results (and, for a
                # permute, two u32 sync flags): keep the results.
                if kind == "all-gather":
                    arrays = arrays[len(arrays) // 2:]
                elif kind == "collective-permute":
                    arrays = arrays[1:2]
            result_bytes = int(sum(math.prod(dims) * _DTYPE_BYTES[dtype]
                                   for dtype, dims in arrays))
            size, groups = _group_size(line)
            op_name = _OP_NAME.search(line)
            found.append(Collective(
                kind=kind, dtype=arrays[0][0] if arrays else "",
                shapes=tuple(dims for _, dims in arrays),
                bytes=array_bytes(kind, result_bytes, size, fused=opcode == "all-reduce"),
                group_size=size,
                replica_groups=groups, op_name=op_name.group(1) if op_name else "",
                loops=loops_of[computation], name=name,
                slices=_slices_spanned(line, groups, slice_of) if whole_program else 1))
    return found


def bytes_per_execution(found: list[Collective], kinds=KINDS) -> float:
    """The arrays `found`'s collectives of `kinds` move in one execution of the program (each
    counted as often as its loops run; a loop of unknown trip count counts once)."""
    return float(sum(c.bytes * (c.executions or 1) for c in found if c.kind in kinds))


def wire_bytes_per_execution(found: list[Collective]) -> float:
    """What each device sends over ICI in one execution with ring algorithms
    (Collective.wire_bytes; the TPU compiler's DCN transfers are not ICI's)."""
    return float(sum(c.wire_bytes * (c.executions or 1) for c in found if not c.dcn_transfer))


def dcn_bytes_per_execution(found: list[Collective]) -> float:
    """What each device sends to other slices in one execution (Collective.dcn_bytes)."""
    return float(sum(c.dcn_bytes * (c.executions or 1) for c in found))
