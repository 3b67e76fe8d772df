"""Passes over the kernel graph, and the pipeline that orders them."""
