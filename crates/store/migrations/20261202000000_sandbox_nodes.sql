-- Which node a sandbox runs on (issue "Outgrow one machine"): the health sweep marks the running
-- sandboxes of a dead node gone, and a node finds the sandboxes it must stop (those marked gone
-- while it was away, those past their deadline). NULL on one machine (`bulkhead serve`) and for
-- sandboxes from before clusters. Kept while a sandbox is paused: its checkpoint is on that node.
ALTER TABLE sandboxes ADD COLUMN node_id TEXT;
CREATE INDEX sandboxes_node_state ON sandboxes (node_id, state);
