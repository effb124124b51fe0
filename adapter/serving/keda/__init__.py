"""KEDA's external scaler (``externalscaler.ExternalScaler`` over gRPC) in front of the adapter's
external metrics: ``metadata`` reads a trigger's ``scalerMetadata``, ``scaler`` answers from the
refreshing value cache, ``grpcserver`` (the only module that imports grpc) serves it."""
