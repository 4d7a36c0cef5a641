
lamp