"""File templates rendered by ``rlforge new`` (see rlforge/tools/scaffold.py).

``plugin/`` becomes a pip-installable plugin package and ``experiment/`` an experiment folder. Every file
ends in ``.tmpl``; ``{{ variable }}`` placeholders in file contents and paths are filled in when rendering.
"""
