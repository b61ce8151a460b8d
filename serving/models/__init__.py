"""What is served: the `Servable` interface (SavedModel, TFLite), version dirs, the registry."""
