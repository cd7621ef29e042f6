"""When and what workers exchange; framework-free, every collective through a Communicator."""
