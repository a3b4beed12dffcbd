"""Quantize: the storage formats chosen at compile time, and their numpy reference.

`weight_formats`: group-wise integer matmul weights (q8g32, q4g64, q4g128: int8 / int4
with one fp16 scale per group along k) and 16-bit floats; packed once, in numpy.
`kv_formats`: the KV-cache formats (f32, f16, bf16, fp8-e4m3, int8, int4 with per-group
scales) and the rounding the kernels do. Plain numpy: importing this needs no TVM.
"""
