"""The one driver layer (cuda-bindings): devices, memory, modules, launches, graphs, TMA tensor maps."""
