"""Jobs in container images: the slice as CDI container edits (:mod:`.cdi`, pure) and the
engines that run a replica's command in its image (:mod:`.engines`, podman and docker by
name). The agent's one seam is :mod:`gpupool.agent.containerize`."""
