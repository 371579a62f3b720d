"""Control plane: services over the store, the scheduling loop, leadership, the clock."""
