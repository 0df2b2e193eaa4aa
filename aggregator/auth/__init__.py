"""Credentials of both gRPC services: collector identities (tokens, Kubernetes, mTLS) and the
Fleet API's bearer tokens with roles."""
