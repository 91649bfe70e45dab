"""Knowledge distillation: losses and output ensembles shared by methods (losses, ensemble); EDL-Dist's
elastic teacher service (wire, teacher, serve, coordinator, redis_server, link, reader, sources,
services; its commands are cli_distill.py); codistillation's and AFSD's prediction servers (predictions,
peer_answers). See docs/ARCHITECTURE.md."""
