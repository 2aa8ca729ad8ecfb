#!/bin/sh
# Guest side of ci.sh, two VMs: the server guest registers a region and serves it; the client
# guest connects over TCP, READs it with RDMA READ and checks every byte.
case $SR_ROLE in
  server) SYMPHONY_PAIR_LISTEN=0.0.0.0:18515 ./conformance_rdma --ignored --exact rdma_pair_server --nocapture ;;
  client) SYMPHONY_PAIR_CONNECT=$SR_PEER:18515 ./conformance_rdma --ignored --exact rdma_pair_client --nocapture ;;
  *) echo "pair.sh: unexpected role $SR_ROLE"; exit 2 ;;
esac
