"""The TFLite variants convert writes and deploy may serve, by name, in the order convert runs."""

VARIANTS: tuple[str, ...] = ("float32", "float16", "dynamic_range", "full_int8")
