"""Multi-agent systems: role graphs (generator -> verifier -> refiner, ChatDev-style chains), per-role
policies on one base served by one engine, MALT's tree sampling and credit assignment."""
