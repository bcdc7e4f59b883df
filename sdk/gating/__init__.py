"""Dependency gating on the client: a :class:`Gate` (``_gating``) follows one gate's newest
watermarks (``_view``) from its sources: the gate service's Redis or HTTP API, or the
dependency groups' committed offsets read directly (``_sources``). Imports only the gate's
public API and the engine's core."""
