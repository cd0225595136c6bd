"""Project-owned fakes of cloud APIs and metadata servers, driven by the real clients."""
