

learners1deskO
c1learner
send_reply*4{"recipient":"customer-42","text":"caf\u00e9 fixed"}