"""Hugging Face folders written from a graph (``folder``).
"""
