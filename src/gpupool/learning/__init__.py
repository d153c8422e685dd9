"""Learned scheduling with the rules in charge.

A predictor of each job's GPU-time (learned only from jobs that already finished), the
rule orderings it competes with (Tiresias' 2D-LAS and 2D-Gittins), the preferential
round-robin that mixes a predicted order with the LAS order, and the guard that falls back
to the rules while the model has too little data or predicts badly. Pure: no clock, no
process, no database; the same events give the same orders.
"""
