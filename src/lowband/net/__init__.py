"""The network as a run configures it, without torch: slow links (links: LinkSpec, the modelled link, real
shaped namespaces) and which workers share a fast network (sites). See docs/ARCHITECTURE.md."""
