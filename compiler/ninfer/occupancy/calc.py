"""CTAs per SM from the CUDA occupancy rules, using target profile fields only.

The rules (those of NVIDIA's occupancy calculator for compute capability 7.0 and later):

- a CTA occupies ceil(threads / 32) warps;
- registers are allocated per warp, rounded up to `register_alloc_unit`; the registers of
  an SM hold floor(registers_per_sm / registers_per_warp) warps, hence
  floor(that / warps per CTA) CTAs;
- shared memory per CTA is (static + dynamic + `reserved_shared_memory_per_block`)
  rounded up to `shared_memory_alloc_unit`; an SM holds floor(shared_memory_per_sm / that)
  CTAs. This assumes the runtime sets the maximum shared-memory carveout
  (cudaFuncAttributePreferredSharedMemoryCarveout = 100) for every kernel it launches, so
  the whole configurable L1/shared array is shared memory;
- at most floor(max_warps_per_sm / warps per CTA) CTAs by warps, and `max_ctas_per_sm`.

A kernel that fits zero CTAs on an SM cannot run at all: `occupancy` raises
`OccupancyError` naming the configuration and the binding limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from ninfer.targets import Target

WARP_SIZE = 32

# Order in which equal limits are reported: the structural limits first.
_LIMIT_NAMES = ("warps", "threads", "registers", "shared memory", "CTA cap")


class OccupancyError(ValueError):
    """A kernel configuration cannot be resident on an SM of the target at all."""


@dataclass(frozen=True)
class Occupancy:
    """Resident CTAs per SM and what each limit alone would allow.

    by_threads: CTAs by the SM's thread slots (max_warps_per_sm x 32 // threads).
    by_warps: the same counted in whole warps, which is what the hardware allocates.
    registers_per_cta: allocated (rounded) registers of one CTA. smem_per_cta: allocated
    (rounded, reserved part included) shared memory of one CTA.
    """

    ctas_per_sm: int
    limited_by: str
    by_threads: int
    by_warps: int
    by_registers: int
    by_smem: int
    by_cta_cap: int
    registers_per_cta: int
    smem_per_cta: int


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def _require_cuda(target: Target) -> None:
    if not target.is_cuda:
        raise OccupancyError(f"target {target.name} is not a CUDA target; occupancy needs "
                             "a GPU profile (arch, SM count, register and smem limits)")


def occupancy(target: Target, threads_per_block: int, registers_per_thread: int,
              smem_bytes: int) -> Occupancy:
    """Resident CTAs per SM for a kernel on `target`.

    `smem_bytes` is everything the CTA uses: static `__shared__` plus dynamic shared
    memory. Raises OccupancyError when the configuration cannot run at all (a per-block
    limit is exceeded, or zero CTAs fit on an SM).
    """
    _require_cuda(target)
    config = (f"{threads_per_block} threads x {registers_per_thread} registers, "
              f"{smem_bytes} bytes shared memory")
    if threads_per_block < 1 or registers_per_thread < 0 or smem_bytes < 0:
        raise OccupancyError(f"{target.name}: invalid kernel configuration ({config})")
    if threads_per_block > target.max_threads_per_block:
        raise OccupancyError(
            f"{target.name}: {config}: {threads_per_block} threads per block exceeds the "
            f"limit of {target.max_threads_per_block}")
    if registers_per_thread > target.registers_per_thread_max:
        raise OccupancyError(
            f"{target.name}: {config}: {registers_per_thread} registers per thread exceeds "
            f"the limit of {target.registers_per_thread_max}")
    if smem_bytes > target.shared_memory_per_block_optin:
        raise OccupancyError(
            f"{target.name}: {config}: shared memory exceeds the opt-in per-block limit of "
            f"{target.shared_memory_per_block_optin} bytes")

    warps = -(-threads_per_block // WARP_SIZE)
    thread_slots = target.max_warps_per_sm * WARP_SIZE
    by_threads = thread_slots // threads_per_block
    by_warps = target.max_warps_per_sm // warps

    regs_per_warp = _round_up(registers_per_thread * WARP_SIZE, target.register_alloc_unit)
    if regs_per_warp:
        by_registers = (target.registers_per_sm // regs_per_warp) // warps
    else:
        by_registers = target.max_ctas_per_sm

    smem_per_cta = _round_up(smem_bytes + target.reserved_shared_memory_per_block,
                             target.shared_memory_alloc_unit)
    by_smem = target.shared_memory_per_sm // max(smem_per_cta, 1)

    limits = (by_warps, by_threads, by_registers, by_smem, target.max_ctas_per_sm)
    ctas = min(limits)
    limited_by = _LIMIT_NAMES[limits.index(ctas)]
    if ctas == 0:
        raise OccupancyError(
            f"{target.name} ({target.arch}): {config}: no CTA fits on an SM "
            f"(limited by {limited_by}: threads {by_threads}, warps {by_warps}, registers "
            f"{by_registers}, shared memory {by_smem} CTAs/SM)")
    return Occupancy(ctas, limited_by, by_threads, by_warps, by_registers, by_smem,
                     target.max_ctas_per_sm, regs_per_warp * warps, smem_per_cta)


def resident_budget(target: Target, occ: Occupancy, schedule_ctas: int | None = None) -> int:
    """CTAs that can be co-resident on the whole GPU: the cooperative launch limit.

    `min(schedule_ctas, ctas_per_sm x sm_count)`; `schedule_ctas` is the most CTAs the
    schedule itself ever asks for (a persistent kernel's fixed grid), if any.
    """
    _require_cuda(target)
    device = occ.ctas_per_sm * target.sm_count
    return device if schedule_ctas is None else min(schedule_ctas, device)
