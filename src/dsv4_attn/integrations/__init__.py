"""Integrations of dsv4_attn's ops into model libraries (imported on demand)."""
