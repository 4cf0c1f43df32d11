"""Speculative decoding: drafters that propose tokens, and the step that verifies them."""
