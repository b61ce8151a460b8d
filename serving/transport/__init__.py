"""gRPC's and HTTP's side: one error envelope each, connection limits, the undecodable guard."""
