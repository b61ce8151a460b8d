"""The four front doors as adapters over the core: TF Serving's and KServe V2's, gRPC and REST."""
