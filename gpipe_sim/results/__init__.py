"""Results: the schema shared by simulator and executor, memory accounting and trace export."""
