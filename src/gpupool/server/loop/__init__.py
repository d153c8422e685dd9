"""The live driver: a loop thread that feeds the core what happened and carries out what it
decided.
"""
