"""Variant comparison pages: the HTML/Markdown page (``page``) and the plot (``plot``).
"""
