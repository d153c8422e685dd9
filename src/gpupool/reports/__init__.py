"""Reports: the monthly review of a pool, from the live database or a simulation.

Contract: a source fills one ReviewData (review_data.py); `build_review` (review/) reads
only that and returns frozen rows; review_csv.py and review_html.py write them. A report
reads data and computes; it imports no driver. To add a report, give it a module (or a
package for many sections) that takes its data record and returns frozen rows.
"""
