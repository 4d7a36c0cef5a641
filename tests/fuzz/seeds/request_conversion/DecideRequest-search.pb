

support-agents1deskE
c1support-agentsearch_docs*#{"query":"refund policy","limit":5}