"""Reports: compare and tune JSON documents rendered to report.json, report.md and a self-contained report.html.

Use :func:`calibkit.report.render.render_report`; matplotlib is imported only when plots are drawn.
"""
