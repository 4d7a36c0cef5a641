

payments-agents1deskf
c1payments-agentpayment_execute*?{"amount":12500.5,"currency":"EUR","account_number":"12345678"}