"""Operations tools: the simulated fleet, the simulated node, cells, and the doctor."""
