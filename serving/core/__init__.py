"""The data plane: `InferenceCore` (inference.py), batching, the dtype rules, status codes."""
