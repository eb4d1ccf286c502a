"""What a run writes and how it is judged: the rows declared once (fields.py, schema.py), the join
of the connectors' records into them (join.py), summary.json, the verdict and what a run prints.
README.md walks through it."""
