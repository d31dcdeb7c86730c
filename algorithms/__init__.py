"""Built-in algorithms (import name ``rlforge.algorithms``): RLModule subclasses plus pure tensor math."""
